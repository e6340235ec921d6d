"""What the frontend tells public clients when a layer behind it fails: the layer and what the
client can act on, never internal addresses (unix socket paths, private host ports) or file
paths. The full detail goes to the frontend's log instead."""

from __future__ import annotations

import re

INTERNAL = "<internal>"
"""What an internal address or path reads as in a public message."""

_STOP = r"""\s,;()'"<>"""
_INTERNAL_ADDRESS = re.compile(
    # A gRPC target or peer (unix:/run/x.sock, unix-abstract:name, ipv4:10.0.0.2:50052, ...) or
    # an absolute path; a colon that ends it ("unix:/x.sock: down") is left to the sentence.
    rf"(?:\b(?:unix|unix-abstract|ipv4|ipv6|dns|vsock):|(?<![\w.~/])/)[^{_STOP}]*?"
    rf"(?=:?(?:[{_STOP}]|$))"
)


def redacted(text: str) -> str:
    """``text`` with each internal address or absolute path replaced by :data:`INTERNAL`."""
    return _INTERNAL_ADDRESS.sub(INTERNAL, text)


def public_message(layer: str, details: str) -> str:
    """``details`` of an error from ``layer`` as a public client reads it: ``"<layer>: ..."``
    once (the layer's own prefix is not repeated), with internal addresses :func:`redacted`."""
    return f"{layer}: {redacted(details.removeprefix(f'{layer}: '))}"
