"""Benchmarks a user runs (``zerolayer bench SCENARIO``); from a checkout, against a baseline."""
