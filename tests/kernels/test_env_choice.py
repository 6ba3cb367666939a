"""The one reader of every ZIPKV_* switch: defaults, normalising, and refusals that say what to set."""

from __future__ import annotations

import pytest

from zipkv.kernels.env_choice import env_choice, env_flag


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, "b"),
        ({"X": ""}, "b"),
        ({"X": "  "}, "b"),
        ({"X": "a"}, "a"),
        ({"X": " A "}, "a"),
        ({"X": "C"}, "c"),
    ],
)
def test_env_choice_defaults_and_normalises(env: dict[str, str], want: str) -> None:
    assert env_choice("X", ("a", "b", "c"), "b", env) == want


def test_env_choice_refuses_a_value_outside_the_choices_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"X='fast': expected one of a, b \(see docs\)"):
        env_choice("X", ("a", "b"), "a", {"X": "fast"}, hint="see docs")


def test_env_flag_is_off_by_default_and_refuses_anything_but_0_or_1() -> None:
    assert env_flag("F", "the measured tile", {}) is False
    assert env_flag("F", "the measured tile", {"F": "1"}) is True
    assert env_flag("F", "the measured tile", {"F": "0"}) is False
    with pytest.raises(ValueError, match="0: the measured tile"):
        env_flag("F", "the measured tile", {"F": "yes"})


def test_every_switch_reads_through_env_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pack, extend, prefill, page-format and decode-kernel switches refuse a typo the same way."""
    import torch

    from zipkv.allocator.pack import POOL_PACK_ENV, pack_choice
    from zipkv.kernels.attention import decode_config as dc
    from zipkv.kernels.attention.extend import EXTEND_KERNEL_ENV, extend_kernel_choice

    cpu = torch.device("cpu")
    calls = [
        (POOL_PACK_ENV, lambda: pack_choice("cpu")),
        (EXTEND_KERNEL_ENV, extend_kernel_choice),
        (dc.PAGE_FORMAT_ENV, lambda: dc.serving_format_version(cpu)),
        (dc.HOPPER_LEAN_ENV, dc.hopper_lean),
        (dc.HOPPER_SPLIT_CAP_ENV, dc.hopper_split_cap),
        (dc.HOPPER_EVEN_SHARES_ENV, dc.hopper_even_shares),
        (dc.HOPPER_PRODUCER_ENV, dc.hopper_producer),
    ]
    for name, call in calls:
        monkeypatch.setenv(name, "typo")
        with pytest.raises(ValueError, match=f"{name}='typo': expected one of"):
            call()
        monkeypatch.delenv(name)
        call()  # unset: the default, no error
    monkeypatch.setenv(POOL_PACK_ENV, " TRITON ")
    assert pack_choice("cpu") == "triton"
