"""Benchmarks (``zerolayer bench SCENARIO``): each scenario against its baseline in one run."""
