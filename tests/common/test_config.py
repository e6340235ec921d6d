"""Derived settings of zerolayer.common.config."""

from __future__ import annotations

import pytest

from zerolayer.common.config import default_num_threads


@pytest.mark.parametrize(("num_cores", "expected"), [(1, 1), (2, 1), (3, 2), (16, 15), (0, 1)])
def test_default_num_threads_leaves_one_core_to_the_other_layers(num_cores, expected) -> None:
    assert default_num_threads(num_cores) == expected
