"""BPE merges that reproduce a SentencePiece-style merge by scores.

llama2.c's ``run.c`` (``encode``) and llama.cpp's SentencePiece tokenizer (``llm_tokenizer_spm``)
merge, again and again, the adjacent pair of symbols whose concatenation is a vocabulary piece
with the highest score. A ``tokenizers`` BPE does the same when every split of a piece into two
pieces is a merge ranked by the piece's score: this module lists those merges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def merges_by_score(
    pieces: Sequence[str],
    scores: Sequence[float],
    mergeable: Callable[[int], bool],
    min_score: float = float("-inf"),
) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a piece, highest priority first.

    Args:
        pieces, scores: the vocabulary and its scores, by id.
        mergeable: whether id's piece takes part in merges (as a result or as a part); the
            first id of a piece that appears twice is the one merged into.
        min_score: a piece scored at or below it is never merged into (it may be a part).

    Returns:
        Merges ranked by the result's score (higher first), then its id, then the length of the
        left part (ties: run.c and llama.cpp take the leftmost pair, which these ranks give for
        the pieces of one score).
    """
    ids: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        if mergeable(i):
            ids.setdefault(piece, i)
    ranked = []
    for target, piece in enumerate(pieces):
        if ids.get(piece) != target or scores[target] <= min_score:
            continue
        for cut in range(1, len(piece)):
            if piece[:cut] in ids and piece[cut:] in ids:
                ranked.append((-scores[target], target, cut, (piece[:cut], piece[cut:])))
    return [merge for *_, merge in sorted(ranked)]
