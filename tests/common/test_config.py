"""Derived settings of zerolayer.common.config."""

from __future__ import annotations

import pytest

from zerolayer.common.config import default_num_threads


@pytest.mark.parametrize(("num_cores", "expected"), [(1, 1), (2, 2), (3, 3), (16, 16), (0, 1)])
def test_default_num_threads_is_one_per_core(num_cores, expected) -> None:
    assert default_num_threads(num_cores) == expected
