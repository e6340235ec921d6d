"""The import picture of the house (docs/architecture.md): the four layers side by side, above the
shared rooms, with no arrow from one layer into another, the frontend's rooms (its public APIs,
none importing another, above the text and routing rooms), no product module importing the
benchmarks, and the comparisons with other systems outside the package (the checkout's
``benchmarks/``, beside ``tests/``). Checked on the source's import statements, so a new arrow
fails here."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zerolayer"
CHECKOUT_BENCHMARKS = ROOT / "benchmarks"
"""Comparisons with other systems and the GPU device check: in the checkout, not the wheel."""
OTHER_SYSTEMS = ("transformers", "llama_cpp", "xgrammar")
"""The systems zerolayer is compared with: imported by ``benchmarks/`` only. (The ``gguf``
package, llama.cpp's file format reader, is a dependency of zerolayer's GGUF checkpoints.)"""
LAYERS = ("loader", "kvstore", "scheduler", "frontend")
ROOMS = ("common", "kv", "sharing", "checkpoints")
"""Shared rooms: used by the layers, never using them."""
GENERATED = ("v1", "kserve")
FRONTEND_APIS = ("text_generation", "openai", "anthropic", "kserve")
"""The frontend's public APIs, a room each: none imports another."""
FRONTEND_ROOMS: dict[str, frozenset[str]] = {
    "text": frozenset(),
    "routing": frozenset(),
    "chat": frozenset(),
    "": frozenset({"text", "routing", "chat"}),
    **{api: frozenset({"", "text"}) for api in FRONTEND_APIS},
    "responses": frozenset({"", "text", "openai"}),
}
"""The frontend's rooms and the other rooms each may import: the text side of a request, the
routing to schedulers and the chat output's parsers import no other room; the layer's top modules
("": the domain object ``generation.TextGenerator``, tenants, metrics, the gRPC and HTTP edges)
use them; a public API uses the top modules and the text room, never routing or another API,
except OpenAI's Responses API, whose routes live on the OpenAI app and share its errors and HTTP
edge (nothing imports ``responses``). Only the program (``__main__``) wires them all."""


def room_of(module: str) -> str:
    """The top-level room of a ``zerolayer.*`` module name ("" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(folder: Path = PACKAGE, prefix: str = "zerolayer.") -> list[tuple[str, str]]:
    """(importing module, imported module or name) for every import of a ``prefix`` module in the
    modules below ``folder`` (at any depth: inside functions too; ``from m import n`` gives ``m``
    and ``m.n``)."""
    found = []
    for path in folder.rglob("*.py"):
        relative = path.relative_to(folder.parent).with_suffix("")
        if relative.parts[1:2] and relative.parts[1] in GENERATED:
            continue
        module = ".".join(relative.parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            # NOTE: every name, not only the first: ``from zerolayer.frontend import openai``
            # is an arrow into openai, and ``import a, b`` two arrows.
            found += [(module, name) for name in names if f"{name}.".startswith(prefix)]
    return found


EVERY_IMPORT = imports(prefix="")
IMPORTS = [(src, dst) for src, dst in EVERY_IMPORT if dst.startswith("zerolayer.")]


def frontend_room(module: str) -> str | None:
    """The frontend room of a ``zerolayer.*`` module name: its subpackage, "" for the layer's top
    modules, "__main__" for the program; None outside the frontend."""
    parts = module.split(".")
    if parts[:2] != ["zerolayer", "frontend"]:
        return None
    if len(parts) > 2 and parts[2] in FRONTEND_ROOMS:
        return parts[2]
    return "__main__" if parts[2:3] == ["__main__"] else ""


def wrong_frontend_arrows(arrows: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """The arrows between the frontend's rooms that :data:`FRONTEND_ROOMS` does not allow."""
    wrong = set()
    for src, dst in arrows:
        source, target = frontend_room(src), frontend_room(dst)
        if source in (None, "__main__") or target is None or target == source:
            continue
        if target not in FRONTEND_ROOMS[source]:
            wrong.add((src, dst))
    return wrong


def test_the_package_holds_only_known_rooms() -> None:
    rooms = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms - set(GENERATED) == {*LAYERS, *ROOMS, "stack", "cli", "bench"}


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_another_layer(layer: str) -> None:
    arrows = {
        (src, dst)
        for src, dst in IMPORTS
        if room_of(src) == layer and room_of(dst) in LAYERS and room_of(dst) != layer
    }
    assert arrows == set()


def test_shared_rooms_import_no_layer_and_nothing_above_them() -> None:
    above = {*LAYERS, "stack", "cli", "bench"}
    arrows = {(s, d) for s, d in IMPORTS if room_of(s) in ROOMS and room_of(d) in above}
    assert arrows == set()


def test_the_stack_imports_no_layer() -> None:
    """The launcher starts the layers as programs (by module name), never from inside."""
    arrows = {(s, d) for s, d in IMPORTS if room_of(s) == "stack" and room_of(d) in LAYERS}
    assert arrows == set()


def test_the_product_never_imports_the_benchmarks() -> None:
    arrows = {(s, d) for s, d in IMPORTS if room_of(s) != "bench" and room_of(d) == "bench"}
    assert arrows == set()


def test_the_comparisons_live_beside_the_tests_and_not_in_the_wheel() -> None:
    """``zerolayer bench`` finds ``benchmarks/`` by its place in a checkout
    (``zerolayer/bench/checkout.py``), never by an import; the wheel packages ``zerolayer*``
    only; the other systems are imported below ``benchmarks/`` alone."""
    for name in ("benchmarks", *OTHER_SYSTEMS):
        assert [(s, d) for s, d in EVERY_IMPORT if f"{d}.".startswith(f"{name}.")] == [], name
    packaged = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert packaged["packages"]["find"]["include"] == ["zerolayer*"]
    assert (CHECKOUT_BENCHMARKS / "__init__.py").is_file()
    compared = {d.split(".")[0] for _, d in imports(CHECKOUT_BENCHMARKS, "")} & {*OTHER_SYSTEMS}
    assert compared == {"transformers", "llama_cpp", "xgrammar"}


def test_every_folder_says_in_one_line_what_lives_there() -> None:
    for init in [*PACKAGE.rglob("__init__.py"), *CHECKOUT_BENCHMARKS.rglob("__init__.py")]:
        if init.is_relative_to(PACKAGE) and init.relative_to(PACKAGE).parts[0] in GENERATED:
            continue
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert docstring, init


def test_the_frontend_holds_only_known_rooms() -> None:
    frontend = PACKAGE / "frontend"
    rooms = {p.name for p in frontend.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(FRONTEND_ROOMS) - {""}


def test_the_frontends_rooms_import_only_what_the_picture_allows() -> None:
    assert wrong_frontend_arrows(IMPORTS) == set()
    # Not vacuous: the rooms do import each other along the allowed arrows.
    assert {
        ("zerolayer.frontend.openai.app", "zerolayer.frontend.generation"),
        ("zerolayer.frontend.kserve.request", "zerolayer.frontend.text.validation"),
        ("zerolayer.frontend.generation", "zerolayer.frontend.routing.scheduler_pool"),
    } <= set(IMPORTS)


@pytest.mark.parametrize(
    "arrow",
    [
        ("zerolayer.frontend.openai.app", "zerolayer.frontend.kserve.request"),
        ("zerolayer.frontend.kserve.server", "zerolayer.frontend.text_generation.server"),
        ("zerolayer.frontend.openai.app", "zerolayer.frontend.routing.router"),
        ("zerolayer.frontend.routing.router", "zerolayer.frontend.openai.errors"),
        ("zerolayer.frontend.routing.scheduler_pool", "zerolayer.frontend.generation"),
        ("zerolayer.frontend.text.validation", "zerolayer.frontend.routing.router"),
        ("zerolayer.frontend.text.tokenizer", "zerolayer.frontend.tenants"),
        ("zerolayer.frontend.generation", "zerolayer.frontend.openai.app"),
        ("zerolayer.frontend.metrics", "zerolayer.frontend.kserve"),
        ("zerolayer.frontend.openai.app", "zerolayer.frontend.responses.app"),
        ("zerolayer.frontend.responses.app", "zerolayer.frontend.routing.router"),
    ],
)
def test_a_wrong_arrow_between_the_frontends_rooms_is_found(arrow: tuple[str, str]) -> None:
    assert wrong_frontend_arrows([arrow]) == {arrow}


@pytest.mark.parametrize(
    "arrow",
    [
        ("zerolayer.frontend.__main__", "zerolayer.frontend.openai.app"),
        ("zerolayer.frontend.openai.app", "zerolayer.frontend.openai.errors"),
        ("zerolayer.frontend.kserve.server", "zerolayer.frontend.tenants"),
        ("zerolayer.frontend.routing.scheduler_client", "zerolayer.common.status"),
        ("zerolayer.frontend.responses.errors", "zerolayer.frontend.openai.errors"),
    ],
)
def test_a_right_arrow_between_the_frontends_rooms_passes(arrow: tuple[str, str]) -> None:
    assert wrong_frontend_arrows([arrow]) == set()
