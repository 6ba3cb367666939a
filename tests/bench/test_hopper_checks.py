"""The Hopper kernel's GPU checks run in parallel processes (bench/kernels/hopper_cases.py): every case
comes back once, under its own index, whether run in this process or in a pool, and a case that raises
stops the run instead of vanishing."""

from __future__ import annotations

import math

import pytest

from bench.kernels.hopper_cases import map_in_processes


def test_every_item_comes_back_once_under_its_index() -> None:
    expected = [(i, math.factorial(i)) for i in range(7)]
    assert list(map_in_processes(math.factorial, range(7), jobs=1)) == expected
    assert sorted(map_in_processes(math.factorial, range(7), jobs=3)) == expected


def test_an_item_that_raises_is_not_lost() -> None:
    with pytest.raises(ValueError):
        list(map_in_processes(math.factorial, [3, -1, 4], jobs=2))  # factorial(-1) raises
