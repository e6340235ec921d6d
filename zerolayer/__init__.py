"""zerolayer: an LLM inference runtime whose serving layers run as separate gRPC processes.

The four layers sit side by side (``loader``, ``kvstore``, ``scheduler``, ``frontend``), above
the shared rooms they all use (``kv``: the KV cache contract, ``sharing``: memory shared between
processes, ``checkpoints``: model directories, ``common``: process plumbing). ``stack`` runs the
four on one machine, ``cli`` is the ``zerolayer`` command, ``bench`` the benchmarks. See
docs/architecture.md.
"""
