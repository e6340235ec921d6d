"""Where protobuf may appear (STYLE: domain code does not import generated ``*_pb2`` modules; only
the conversion module and the handlers do). Checked on the source's import statements and calls,
so a new ``*_pb2`` import in domain code, or a message built by hand in a servicer or a client,
fails here."""

from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "zerolayer"
GENERATED = ("v1", "kserve")

CONVERSION = ("common/convert/*.py",)
"""The conversion module: every zerolayer.v1 message to and from its domain form."""
KSERVE_CODEC = (
    "frontend/kserve/request.py",
    "frontend/kserve/response.py",
    "frontend/kserve/tensors.py",
)
"""KServe's conversion (its requests read into generation terms, results written as responses);
in the frontend, the only layer that speaks KServe."""
SERVICERS = ("*/server.py",)
"""Thin handlers, the public APIs' included (``frontend/kserve/server.py``; common/server.py: the
bootstrap, with grpc's health service)."""
CLIENTS = ("*_client.py", "common/clients.py")
"""Clients of another layer's service: stubs and the conversion module."""
ENTRY_POINTS = ("*/__main__.py",)
"""Each layer's program registers its servicer (``add_*Servicer_to_server``)."""
OUTSIDE_CLIENTS = (
    "stack/probes.py",
    "stack/health_watch.py",
    "cli/client.py",
    "cli/generate_request.py",
    "cli/chat_request.py",
    "cli/generate_output.py",
    "cli/model_calls.py",
    "cli/health.py",
    "bench/*.py",
)
"""Callers of the public API or of health and stats from outside the layers, the way any client
would: the stack's health probing, the ``zerolayer generate``, ``tokenize`` and ``info`` clients,
``zerolayer health`` (a probe command), the benchmarks."""
ALLOWED = (*CONVERSION, *KSERVE_CODEC, *SERVICERS, *CLIENTS, *ENTRY_POINTS, *OUTSIDE_CLIENTS)


def sources() -> dict[str, ast.Module]:
    """Every module of the package but the generated ones, by path relative to the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.split("/")[0] not in GENERATED:
            found[relative] = ast.parse(path.read_text())
    return found


SOURCES = sources()


def pb_names(tree: ast.Module) -> dict[str, str]:
    """Names bound to generated message modules (``*_pb2``, not ``*_pb2_grpc``) -> module."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(a.name, a.asname or a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = f"{node.module}." if node.module else ""
            pairs = [(base + a.name, a.asname or a.name) for a in node.names]
        else:
            continue
        names |= {bound: module for module, bound in pairs if module.endswith("_pb2")}
    return names


def matches(relative: str, patterns: tuple[str, ...]) -> bool:
    """True when ``relative`` matches one of ``patterns`` (``*`` also crosses folders)."""
    return any(fnmatch(relative, p) for p in patterns)


def test_only_conversion_handlers_clients_and_entry_points_import_protobuf() -> None:
    importing = {path for path, tree in SOURCES.items() if pb_names(tree)}
    assert {path for path in importing if not matches(path, ALLOWED)} == set()
    # The list stays true: the conversion module and the codec do import messages.
    assert {"common/convert/kvstore.py", *KSERVE_CODEC} <= importing


def test_the_domain_modules_named_in_the_style_guide_import_none() -> None:
    for path in ("kvstore/block_pool.py", "kvstore/prefix_cache.py", "scheduler/core/engine.py"):
        assert not pb_names(SOURCES[path]), path
    assert not matches("kvstore/block_pool.py", ALLOWED)


def built_messages(tree: ast.Module) -> list[str]:
    """``module.Message(...)`` calls on generated message modules, as source text."""
    names = pb_names(tree)
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            root = node.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in names:
                calls.append(ast.unparse(node.func))
    return calls


def test_servicers_and_clients_build_no_message_themselves() -> None:
    """Protobuf in, one call into the domain object, protobuf out through the conversion."""
    handlers = {
        path
        for path in SOURCES
        if matches(path, (*SERVICERS, *CLIENTS)) and path != "common/server.py"
    }
    assert {
        "kvstore/server.py",
        "scheduler/kv_client.py",
        "frontend/kserve/server.py",
        "frontend/text_generation/server.py",
    } <= handlers
    assert {path: built_messages(SOURCES[path]) for path in handlers} == {
        path: [] for path in handlers
    }
