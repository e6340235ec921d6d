"""What the wheel leaves out of the benchmarks: zerolayer against other systems, and the GPU check.

A folder of the checkout, beside ``tests/``, never in the wheel (pyproject.toml packages only
``zerolayer*``). ``zerolayer bench``, when zerolayer is imported from a checkout (``pip install
-e .``), finds it there (:mod:`zerolayer.bench.checkout`) and adds what it declares below to its
scenarios; nothing in ``zerolayer/`` imports it. The GPU device check
(``benchmarks.device``, run by ``scripts/device_check.sh``), the structured-output comparison and
the kernel micro-benchmarks run with ``python -m`` from the checkout's root.
"""

SCENARIOS = {
    "llamacpp": "benchmarks.llamacpp.scenario",
    "gguf": "benchmarks.llamacpp.gguf_scenario",
}
"""Scenarios of ``zerolayer bench`` that exist only to compare zerolayer with another system: the
module of each, with ``HELP``, ``REQUIREMENTS``, ``SMOKE``, ``add_arguments(p)`` and
``main(args) -> dict`` as the wheel's scenarios have."""

BASELINES = {
    **{
        name: f"benchmarks.hf.{name}"
        for name in ("multiturn", "chat", "throughput", "latency", "coldstart", "roofline")
    },
    "agent": "benchmarks.llamacpp.agent",
}
"""The baseline of each wheel scenario that is compared with another system (Hugging Face
transformers on the same checkpoint; for ``agent``, llama.cpp's llama-server): a module with
``SYSTEM``, ``REQUIREMENTS``, ``SMOKE``, ``add_arguments(p)`` and
``compare(...) -> zerolayer.bench.checkout.Comparison``, whose arguments each scenario states."""
