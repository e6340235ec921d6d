"""What a checkout adds to ``zerolayer bench``: the comparisons with other systems.

The wheel's scenarios measure zerolayer. The code that runs another system on a scenario's
workload (Hugging Face transformers, llama.cpp) is no part of the product: it lives in the
checkout's ``benchmarks/`` folder, beside ``tests/``, which the wheel does not contain. When
zerolayer is imported from a checkout (``pip install -e .``), ``zerolayer bench`` finds that folder
beside the package and nowhere else (a ``benchmarks`` package installed by someone else is never
picked up), adds the scenarios it declares (``llamacpp``) and gives each wheel scenario its
baseline: the scenario then reports the baseline's figures, the ratios and the targets against
it, as docs/benchmarks.md shows. Installed from a wheel, a scenario says it was not compared.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

CHECKOUT_ROOT = Path(__file__).resolve().parents[2]
"""The folder above the ``zerolayer`` package: a checkout's root when installed with ``-e``."""
PACKAGE = "benchmarks"

NOT_COMPARED = (
    "not compared: the baseline (another system on the same workload) runs from a checkout of "
    "zerolayer, whose benchmarks/ folder the wheel leaves out (docs/benchmarks.md)"
)
"""A scenario's ``baseline`` entry when it ran without one."""


@dataclass(frozen=True)
class Comparison:
    """What a baseline adds to its scenario's results document and plot."""

    results: dict
    """Merged into the document: the baseline's figures and the ratios of zerolayer's to them.
    An entry that is a dict in both (``targets``, ``torch_threads``...) joins the scenario's."""
    plot: dict = field(default_factory=dict)
    """The baseline's entries of the scenario's plot, in that plot's shape (bars or lines by
    name, per panel where the plot has several)."""


def checkout_benchmarks() -> ModuleType | None:
    """The checkout's ``benchmarks`` package, imported from beside the ``zerolayer`` package; None
    when zerolayer is not imported from a checkout (an installed wheel)."""
    init = CHECKOUT_ROOT / PACKAGE / "__init__.py"
    if not (init.is_file() and (CHECKOUT_ROOT / "pyproject.toml").is_file()):
        return None
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        same = Path(getattr(loaded, "__file__", "") or "").resolve() == init
        return loaded if same else None
    spec = importlib.util.spec_from_file_location(
        PACKAGE, init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def checkout_scenarios() -> dict[str, str]:
    """Module name of each scenario only a checkout has (empty from a wheel)."""
    benchmarks = checkout_benchmarks()
    return dict(benchmarks.SCENARIOS) if benchmarks is not None else {}


def baseline_for(scenario: str) -> ModuleType | None:
    """The checkout's baseline module of a wheel scenario (``compare``, ``add_arguments``,
    ``SMOKE``, ``REQUIREMENTS``), or None: from a wheel, or a scenario without one."""
    benchmarks = checkout_benchmarks()
    if benchmarks is None or scenario not in benchmarks.BASELINES:
        return None
    return importlib.import_module(benchmarks.BASELINES[scenario])


def compared(results: dict, comparison: Comparison | None) -> dict:
    """``results`` with ``comparison``'s merged in (an entry that is a dict in both one level
    deep: ``targets``, ``torch_threads``... gain the baseline's keys), or with ``baseline`` saying
    it was not compared. Does not modify ``results``."""
    if comparison is None:
        return {**results, "baseline": NOT_COMPARED}
    merged = dict(results)
    for key, value in comparison.results.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = {**merged[key], **value} if both else value
    return merged
