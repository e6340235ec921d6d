"""The README and docs/ hold together: every relative link reaches an existing file and heading,
and every ``zerolayer`` command in their code blocks is one the real command line accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LAYERS = ("loader", "kvstore", "scheduler", "frontend")

FENCE = re.compile(r"^```[^\n]*\n.*?^```$", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation other than ``-`` and
    ``_`` dropped, spaces as ``-``; a repeated heading gets ``-1``, ``-2`` ..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(path.read_text()))
        if not re.match(r"[a-z]+:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        file = (doc.parent / file_part).resolve() if file_part else doc
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, broken


def test_the_readme_links_every_doc() -> None:
    linked = {Path(target).name for target in relative_links(ROOT / "README.md")}
    assert {doc.name for doc in DOCS[1:]} <= linked


def test_the_link_check_fails_on_a_missing_heading(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n## Getting a model (`up`)\n\nsee [x](#getting-a-model-up)\n")
    assert anchors(doc) == {"title", "getting-a-model-up"}
    assert "getting-a-model" not in anchors(doc)


def shell_commands(text: str) -> list[list[str]]:
    """The simple commands of every fenced code block, as argument lists: continuation lines and
    quotes over several lines joined, comments dropped, split at pipes and ``&&``, leading
    ``VAR=value`` removed."""
    commands = []
    for block in FENCE.findall(text):
        body = block.split("\n", 1)[1].rsplit("```", 1)[0].replace("\\\n", " ")
        pending = ""
        for line in body.splitlines():
            try:
                words = shlex.split(pending + line, comments=True)
            except ValueError:  # a quote open until a later line (or no shell at all)
                pending += line + "\n"
                continue
            pending = ""
            command: list[str] = []
            for word in [*words, "|"]:
                if word in ("|", "||", "&&", ";", "&"):
                    while command and re.fullmatch(r"[A-Z_]+=\S*", command[0]):
                        command.pop(0)
                    if command:
                        commands.append(command)
                    command = []
                else:
                    command.append(word)
    return commands


def zerolayer_argv(command: list[str]) -> list[str] | None:
    """The ``zerolayer`` arguments of a command (``python -m zerolayer.<layer>`` as ``zerolayer
    <layer>``), without its optional ``[--flag VALUE]`` groups; None for any other program."""
    if Path(command[0]).name == "zerolayer":
        argv = command[1:]
    elif Path(command[0]).name.startswith("python") and command[1:2] == ["-m"]:
        module = command[2].removeprefix("zerolayer.")
        if module not in LAYERS:
            return None
        argv = [module, *command[3:]]
    else:
        return None
    kept, optional = [], False
    for word in argv:
        optional = optional or word.startswith("[-")
        if not optional:
            kept.append(word)
        optional = optional and not word.endswith("]")
    return kept


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        for command in shell_commands(doc.read_text()):
            argv = zerolayer_argv(command)
            if argv is not None:
                found.append((doc.name, argv))
    return found


def test_the_docs_show_commands_of_every_kind() -> None:
    subcommands = {argv[0] for _, argv in documented_commands()}
    assert {"up", "generate", "tokenize", "info", "health", "bench", *LAYERS} <= subcommands


@pytest.mark.parametrize(
    ("doc", "argv"), documented_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_every_documented_command_is_accepted_by_the_cli(doc: str, argv: list[str]) -> None:
    import torch

    from zerolayer.cli.main import build_parser

    if any(word.startswith("cuda") for word in argv) and not torch.cuda.is_available():
        pytest.skip("--device cuda is checked against the machine as it is parsed: needs CUDA")
    try:
        build_parser(argv[0]).parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 0, f"{doc}: zerolayer {shlex.join(argv)}"


def test_a_misspelt_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from zerolayer.cli.main import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser("up").parse_args(["up", "--modle", "DIR"])
    assert info.value.code == 2
