"""The Hopper kernel with a producer partition (kernels/attention/hopper/specialized.py) without a GPU: the
switch that asks for it, the plan's shape for it, and which plans its launch takes or refuses, loudly.
Its compile for sm_90 is in test_decode_hopper_compile.py; its numerics on the GPU in
bench/kernels/hopper_cases.py (``_producer_check``)."""

from __future__ import annotations

import pytest
import torch

from zipkv.kernels.attention import decode_config as dc
from zipkv.kernels.attention import decode_plan
from zipkv.kernels.attention.decode_plan import DecodePlan, plan_decode
from zipkv.kernels.attention.hopper import producer_launch
from zipkv.kernels.format.layout import PageFormat

H200_SMS = 132


def test_the_switch_is_off_by_default_and_takes_0_1_or_2() -> None:
    name = dc.HOPPER_PRODUCER_ENV
    assert dc.hopper_producer({}) == 0 and dc.hopper_producer({name: ""}) == 0
    assert [dc.hopper_producer({name: v}) for v in ("0", "1", "2", " 2 ")] == [0, 1, 2, 2]
    with pytest.raises(ValueError, match=f"{name}='yes': expected one of 0, 1, 2"):
        dc.hopper_producer({name: "yes"})


def test_the_sglang_worker_refuses_it_until_it_serves() -> None:
    """The first SGLang run with it stalled (docs/benchmarks.md): the worker's start-up read refuses it with
    what to do, and takes it unset."""
    assert dc.hopper_producer_for_serving({}) == 0
    for mode in ("1", "2"):
        with pytest.raises(ValueError, match=r"kernel benchmarks only .* unset it to serve"):
            dc.hopper_producer_for_serving({dc.HOPPER_PRODUCER_ENV: mode})


def _hopper_plan(
    monkeypatch: pytest.MonkeyPatch, head_dim: int, batch: int, producer_on: bool, **asked: int
) -> DecodePlan:
    """A Hopper plan (the kernel choice forced: a CPU here) of ``batch`` requests of 8448 tokens, 8 KV
    heads, with ``$ZIPKV_HOPPER_PRODUCER`` as ``producer_on`` and even shares on where they pay."""
    lens = torch.full((batch,), 8448, dtype=torch.int32)
    pages = (lens + 15) // 16
    indptr = torch.cat([torch.zeros(1, dtype=torch.int32), pages.cumsum(0).to(torch.int32)])
    ids = torch.arange(int(pages.sum()), dtype=torch.int32)
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=8, version=3)
    monkeypatch.setattr(decode_plan, "decode_impl", lambda impl, fmt, device: "hopper")
    monkeypatch.setattr(decode_plan, "producer_mode", lambda: int(producer_on))
    monkeypatch.setattr(decode_plan, "_even_shares_on", lambda: True)
    return plan_decode(ids, indptr, lens, fmt, 32, num_sms=H200_SMS, **asked)


@pytest.mark.parametrize(("batch", "takes_it"), [(1, False), (18, False), (29, False), (30, True), (32, True),
                                                (59, True), (64, True)])  # fmt: skip
def test_with_the_switch_on_the_plan_takes_the_producers_shape_where_the_batch_fills_its_wave(
    batch: int, takes_it: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four consumer warps over 64-token tiles, planned for two programs an SM (264 slots on 132 SMs, 8 KV
    heads: batch >= 30 fills nine tenths of them), never the two-warp kernel's register cap or even shares;
    a smaller batch, the switch off, or another head_dim: the two-warp kernel's plan as before."""
    plan = _hopper_plan(monkeypatch, 128, batch, True)
    assert producer_launch.producer_fits(plan) is takes_it
    if takes_it:
        assert (plan.block_n, plan.num_warps) == (64, 4)
        assert plan.maxnreg is None and plan.program_items is None
    else:
        assert (plan.block_n, plan.num_warps) == (dc.HOPPER_CONFIG.block_n, dc.HOPPER_CONFIG.num_warps)
    off = _hopper_plan(monkeypatch, 128, batch, False)
    assert (off.block_n, off.num_warps) == (dc.HOPPER_CONFIG.block_n, dc.HOPPER_CONFIG.num_warps)
    assert not producer_launch.producer_fits(off)
    other = _hopper_plan(monkeypatch, 64, batch, True)
    assert (other.block_n, other.num_warps) == (dc.HOPPER_CONFIG.block_n, dc.HOPPER_CONFIG.num_warps)


NO_OPTIONS = (False, False, True)  # (per-warp softmax, lazy rescale, lean tile) as _tile_options gives them


@pytest.mark.parametrize(
    ("shape", "asked", "env", "options", "timing", "expected"),
    [
        ({}, None, 1, NO_OPTIONS, False, 1),  # the producer's plan, the switch on: its mode
        ({}, None, 2, NO_OPTIONS, False, 2),
        ({}, None, 0, NO_OPTIONS, False, 0),  # switch off
        ({}, 0, 2, NO_OPTIONS, False, 0),  # asked off: honoured
        ({}, 2, 0, NO_OPTIONS, False, 2),  # asked on
        ({}, 3, 0, NO_OPTIONS, False, "producer must be 0, 1 or 2, got 3"),
        ({"num_warps": 2, "block_n": 32}, None, 2, NO_OPTIONS, False, 0),  # not its shape: decode.py's
        ({"num_warps": 2, "block_n": 32}, 1, 0, NO_OPTIONS, False, "64-token tiles over 4 warps"),
        ({"block_n": 128}, 1, 0, NO_OPTIONS, False, "block_n 128, 4 warps"),
        ({"programs": 3}, 2, 0, NO_OPTIONS, False, "even shares"),
        ({}, 1, 0, (True, False, False), False, "shared softmax"),
        ({}, None, 1, (False, True, True), False, "ZIPKV_HOPPER_LAZY_RESCALE"),
        ({}, 2, 0, NO_OPTIONS, True, "timing"),
    ],
)
def test_the_launch_takes_the_producer_where_asked_and_its_plan_fits(
    shape: dict[str, int],
    asked: int | None,
    env: int,
    options: tuple[bool, bool, bool],
    timing: bool,
    expected: int | str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked_shape = {"num_warps": 4, "block_n": 64, **shape}
    plan = _hopper_plan(monkeypatch, 128, 4, False, **asked_shape)
    monkeypatch.setattr(producer_launch, "producer_mode", lambda: env)
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            producer_launch.producer_choice(plan, asked, options, timing)
    else:
        assert producer_launch.producer_choice(plan, asked, options, timing) == expected


def test_the_launch_refuses_a_plan_not_of_its_shape_before_it_starts() -> None:
    """Through decode_attention_hopper (no GPU here: refused before any launch)."""
    from zipkv.kernels.attention.hopper.launch import decode_attention_hopper

    v3 = PageFormat(head_dim=128, num_kv_heads=2, version=3)
    ids, indptr, lens = (torch.tensor(x, dtype=torch.int32) for x in (range(2), [0, 2], [30]))
    plan = plan_decode(ids, indptr, lens, v3, 8, block_n=32, num_warps=2)
    q = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="64-token tiles over 4 warps"):
        decode_attention_hopper(
            plan, q, torch.zeros(1, dtype=torch.uint8), ids.long(), ids.byte(), 0.1, producer=1
        )
