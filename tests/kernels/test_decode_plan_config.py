"""The decode kernel's shape: the tuned tables, or an override from $ZIPKV_DECODE_KERNEL validated loudly."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch

from zipkv.kernels.attention.decode_config import (
    KERNEL_CONFIG_ENV,
    KERNEL_CONFIGS,
    DecodeKernelConfig,
    kernel_config,
    parse_kernel_config,
)
from zipkv.kernels.attention.decode_plan import plan_decode
from zipkv.kernels.format.layout import PageFormat


def _plan(fmt: PageFormat):  # type: ignore[no-untyped-def]
    lens = torch.tensor([100, 7], dtype=torch.int32)
    pages = (lens + 15) // 16
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), pages.cumsum(0)]).to(torch.int32)
    return plan_decode(torch.arange(int(pages.sum()), dtype=torch.int32), indptr, lens, fmt, 8)


def test_defaults_are_the_tuned_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    assert kernel_config(128) == KERNEL_CONFIGS[128] == DecodeKernelConfig(32, 1, 1, 2, 8, prefetch=False)
    plan = _plan(PageFormat(128, 2))
    tuned = KERNEL_CONFIGS[128]
    assert (plan.block_n, plan.num_warps, plan.num_stages, plan.twin_num_stages, plan.prefetch) == (
        tuned.block_n, tuned.num_warps, tuned.num_stages, tuned.twin_num_stages, tuned.prefetch,
    )  # fmt: skip


def test_override_reaches_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KERNEL_CONFIG_ENV, "64:2:2:3:4:1")
    plan = _plan(PageFormat(128, 2))
    assert (plan.block_n, plan.num_warps, plan.num_stages, plan.twin_num_stages, plan.prefetch) == (
        64, 2, 2, 3, True,
    )  # fmt: skip
    assert kernel_config(64) == DecodeKernelConfig(64, 2, 2, 3, 4, prefetch=True)  # every head_dim


def test_the_text_form_round_trips_and_a_passed_config_replaces_the_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    for config in KERNEL_CONFIGS.values():
        assert parse_kernel_config(config.text) == config
    assert DecodeKernelConfig(64, 2, 2, 3, 4, prefetch=True).text == "64:2:2:3:4:1"
    lens = torch.tensor([100], dtype=torch.int32)
    indptr = torch.tensor([0, 7], dtype=torch.int32)
    config = DecodeKernelConfig(64, 2, 3, 4, 1, prefetch=True)
    plan = plan_decode(torch.arange(7, dtype=torch.int32), indptr, lens, PageFormat(128, 2), 8, config=config)
    assert (plan.block_n, plan.num_warps, plan.num_stages, plan.twin_num_stages, plan.prefetch) == (
        64, 2, 3, 4, True,
    )  # fmt: skip
    assert (
        plan_decode(
            torch.arange(7, dtype=torch.int32), indptr, lens, PageFormat(128, 2), 8, config=config, block_n=16
        ).block_n
        == 16
    )  # a single field still overrides


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("32:1:1:2:8", "expected block_n:warps"),
        ("32:1:x:2:8:0", "expected block_n:warps"),
        ("24:1:1:2:8:0", "power of two"),
        ("8:1:1:2:8:0", "power of two"),
        ("32:3:1:2:8:0", "warps in 1/2/4/8"),
        ("32:1:0:2:8:0", "stages 1..4"),
        ("32:1:1:2:0:0", "ctas_per_sm >= 1"),
        ("32:1:1:2:8:2", "prefetch is 0 or 1"),
    ],
)
def test_a_malformed_override_is_refused_with_the_expected_form(
    monkeypatch: pytest.MonkeyPatch, text: str, why: str
) -> None:
    monkeypatch.setenv(KERNEL_CONFIG_ENV, text)
    with pytest.raises(ValueError, match=why):
        _plan(PageFormat(128, 2))
    with pytest.raises(ValueError, match="--configs="):  # the bench's flag names itself
        parse_kernel_config(text, "--configs")


def test_the_hopper_kernel_is_chosen_only_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from zipkv.kernels.attention.decode_config import DECODE_IMPL_ENV

    ids = torch.arange(4, dtype=torch.int32)
    indptr = torch.tensor([0, 4], dtype=torch.int32)
    lens = torch.tensor([60], dtype=torch.int32)
    v3 = PageFormat(head_dim=128, num_kv_heads=2, version=3)
    assert plan_decode(ids, indptr, lens, v3, 8).impl == "portable"  # the default
    with pytest.raises(ValueError, match="sm_90"):  # this machine has no GPU
        plan_decode(ids, indptr, lens, v3, 8, impl="hopper")
    with pytest.raises(ValueError, match="v3"):
        plan_decode(ids, indptr, lens, PageFormat(head_dim=128, num_kv_heads=2), 8, impl="hopper")
    monkeypatch.setenv(DECODE_IMPL_ENV, "hoper")
    with pytest.raises(ValueError, match="expected one of auto, portable, hopper"):
        plan_decode(ids, indptr, lens, v3, 8)


def test_auto_picks_the_hopper_kernel_for_v3_pages_on_sm90_and_the_pool_writes_v3_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from zipkv.kernels.attention import decode_config as dc
    from zipkv.kernels.format.layout import FORMAT_VERSION

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    v2, v3 = (PageFormat(head_dim=128, num_kv_heads=2, version=v) for v in (2, 3))
    assert dc.decode_impl(None, v3, cpu) == "portable"
    assert dc.serving_format_version(cpu, {}) == FORMAT_VERSION
    monkeypatch.setattr(dc, "is_sm90", lambda device: device.type == "cuda")  # as on an H200
    assert dc.decode_impl("auto", v3, gpu) == "hopper"
    assert dc.decode_impl("auto", v2, gpu) == "portable"  # the Hopper kernel reads v3 only
    assert dc.decode_impl("portable", v3, gpu) == "portable"  # asked for: honoured
    assert dc.serving_format_version(gpu, {}) == 3
    assert dc.serving_format_version(gpu, {dc.PAGE_FORMAT_ENV: "2"}) == 2
    assert dc.serving_format_version(cpu, {dc.PAGE_FORMAT_ENV: "3"}) == 3
    with pytest.raises(ValueError, match="expected one of 2, 3"):
        dc.serving_format_version(gpu, {dc.PAGE_FORMAT_ENV: "1"})


def _check_switch(read: Callable[[dict[str, str]], bool], name: str, default: bool = False) -> None:
    """A Hopper 0/1 switch: ``default`` when unset or empty, on with "1", off with "0", anything else
    refused."""
    assert read({}) is default and read({name: ""}) is default
    assert read({name: "1"}) is True
    assert read({name: "0"}) is False
    with pytest.raises(ValueError, match=f"{name}='on': expected one of 0, 1"):
        read({name: "on"})


def _refused(pages: int, tokens: int, block_n: int, match: str, **switches: bool) -> None:
    """A one-request Hopper launch (v3 pages, 2 warps) with ``switches`` is refused before it starts (no GPU
    here): ``match`` says why."""
    from zipkv.kernels.attention.hopper.launch import decode_attention_hopper

    v3 = PageFormat(head_dim=128, num_kv_heads=2, version=3)
    ids, indptr, lens = (torch.tensor(x, dtype=torch.int32) for x in (range(pages), [0, pages], [tokens]))
    plan = plan_decode(ids, indptr, lens, v3, 8, block_n=block_n, num_warps=2)
    q = torch.zeros(1, 16, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        decode_attention_hopper(
            plan, q, torch.zeros(1, dtype=torch.uint8), ids.long(), ids.byte(), 0.1, **switches
        )


def test_the_per_warp_softmax_is_asked_for_by_0_or_1_and_needs_one_page_per_warp() -> None:
    from zipkv.kernels.attention import decode_config as dc

    _check_switch(dc.hopper_warp_softmax, dc.HOPPER_WARP_SOFTMAX_ENV)  # off by default: one softmax a program
    # 64-token tiles are four pages: two warps cannot each own one. Refused before any launch (no GPU here).
    _refused(4, 60, 64, "one page: block_n 64 is 4 pages for 2 warps", warp_softmax=True)


def test_the_lazy_rescale_is_asked_for_by_0_or_1_and_needs_the_shared_softmax() -> None:
    from zipkv.kernels.attention import decode_config as dc

    _check_switch(dc.hopper_lazy_rescale, dc.HOPPER_LAZY_RESCALE_ENV)  # off by default: every tile rescales
    # Asked for together with the per-warp softmax (no program-wide row max): refused before any launch.
    _refused(2, 30, 32, "lazy rescale needs the shared softmax", warp_softmax=True, lazy_rescale=True)


def test_the_lean_tile_is_asked_for_by_0_or_1_and_needs_the_shared_softmax() -> None:
    from zipkv.kernels.attention import decode_config as dc

    _check_switch(dc.hopper_lean, dc.HOPPER_LEAN_ENV, default=True)  # on by default: measured faster
    # Asked for with the per-warp softmax (whose exchanges it does not have): refused before any launch.
    _refused(2, 30, 32, "lean tile needs the shared softmax", warp_softmax=True, lean=True)


H200_SMS = 132


@pytest.mark.parametrize(
    ("batch", "head_dim", "warps", "capped"),
    [
        (32, 128, 2, True),  # 256 programs split 2 ways at four per SM: capped, planned for six (3 splits)
        (1, 128, 2, True),  # one long request: split
        (64, 128, 2, False),  # 512 programs fill the 528 slots of four per SM: no split, no cap
        (128, 128, 2, False),
        (32, 64, 2, False),  # head_dims and warps not measured with the cap: unchanged
        (32, 256, 2, False),
        (32, 128, 4, False),
    ],
)
def test_the_split_cap_takes_six_per_sm_where_four_per_sm_would_split(
    batch: int, head_dim: int, warps: int, capped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from zipkv.kernels.attention import plan_shape
    from zipkv.kernels.attention.decode_config import HOPPER_CONFIG, HOPPER_SPLIT_CAP
    from zipkv.kernels.attention.plan_shape import choose_max_splits, hopper_shape

    base = replace(HOPPER_CONFIG, num_warps=warps)
    fmt, cpu = PageFormat(head_dim=head_dim, num_kv_heads=8, version=3), torch.device("cpu")
    monkeypatch.setattr(plan_shape, "_split_cap", lambda device: True)
    cfg, regs = hopper_shape(base, fmt, batch, H200_SMS, cpu, free=True)
    assert (cfg.ctas_per_sm, regs) == ((HOPPER_SPLIT_CAP[0], HOPPER_SPLIT_CAP[1]) if capped else (4, None))
    assert hopper_shape(base, fmt, batch, H200_SMS, cpu, free=False) == (base, None)  # a shape asked for
    monkeypatch.setattr(plan_shape, "_split_cap", lambda device: False)
    assert hopper_shape(base, fmt, batch, H200_SMS, cpu, free=True) == (base, None)  # off: as ever
    if batch == 32 and capped:  # the splits the H200 bench used: 3 at six per SM, 2 at four
        assert choose_max_splits(batch * 8, H200_SMS * cfg.ctas_per_sm, 128, 1) == 3
        assert choose_max_splits(batch * 8, H200_SMS * 4, 128, 1) == 2


@pytest.mark.parametrize(
    ("name", "measured"),
    [
        ("NVIDIA H200", True),
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H800", False),
        ("NVIDIA A100-SXM4-80GB", False),
    ],
)
def test_the_split_cap_is_on_by_default_only_where_it_was_measured(
    name: str, measured: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zipkv.kernels.attention import decode_config as dc

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert dc.split_cap_measured(torch.device("cuda", 0)) is measured


def test_the_launch_takes_the_plans_register_cap_unless_asked_otherwise() -> None:
    from dataclasses import replace

    from zipkv.kernels.attention import decode_config as dc
    from zipkv.kernels.attention.hopper.launch import register_cap

    _check_switch(dc.hopper_split_cap, dc.HOPPER_SPLIT_CAP_ENV, default=True)  # where measured
    _check_switch(partial(dc.hopper_split_cap, measured_here=False), dc.HOPPER_SPLIT_CAP_ENV)  # off elsewhere
    assert not dc.split_cap_measured(torch.device("cpu"))
    plan = _plan(PageFormat(head_dim=128, num_kv_heads=2, version=3))
    assert plan.maxnreg is None  # a portable plan on the CPU: no cap
    assert register_cap(None, 128, 2, plan) is None  # the compiler's registers at 2 warps
    capped = replace(plan, maxnreg=168)
    assert register_cap(None, 128, 2, capped) == 168
    assert register_cap(0, 128, 2, capped) is None  # 0: the compiler's, whatever the plan says
    assert register_cap(200, 128, 2, capped) == 200
    assert register_cap(None, 128, 4, plan) == 168  # the 4-warp table entry, as before


@pytest.mark.parametrize(
    ("batch", "head_dim", "warps", "programs"),
    [
        (59, 128, 2, 66),  # 472 programs on 528 slots (0.89): measured faster with even shares
        (64, 128, 2, None),  # 512 on 528 (0.97): measured slower, so not taken
        (32, 128, 2, None),  # two splits at four per SM fill 0.97 (the cap then takes six per SM)
        (1, 128, 2, None),  # 66 splits fill every slot
        (40, 128, 2, 66),  # 320 programs, one wave left 40% idle
        (59, 64, 2, None),  # not measured at head_dim 64
        (59, 128, 4, None),  # nor at four warps
    ],
)
def test_even_shares_are_taken_where_equal_requests_leave_slots_idle(
    batch: int, head_dim: int, warps: int, programs: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from zipkv.kernels.attention import decode_plan
    from zipkv.kernels.attention.decode_config import HOPPER_CONFIG
    from zipkv.kernels.attention.plan_shape import even_shares_programs

    cfg = replace(HOPPER_CONFIG, num_warps=warps, block_n=16 * warps)
    assert even_shares_programs(cfg, batch, 8, head_dim, H200_SMS) == programs
    # through the plan, with the switch on: the programs' items, and no register cap beside them
    lens = torch.full((batch,), 8448, dtype=torch.int32)
    pages = (lens + 15) // 16
    indptr = torch.cat([torch.zeros(1, dtype=torch.int32), pages.cumsum(0).to(torch.int32)])
    ids = torch.arange(int(pages.sum()), dtype=torch.int32)
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=8, version=3)
    monkeypatch.setattr(decode_plan, "decode_impl", lambda impl, fmt, device: "hopper")  # (a CPU here)
    monkeypatch.setattr(decode_plan, "_even_shares_on", lambda: True)
    plan = plan_decode(ids, indptr, lens, fmt, 32, num_sms=H200_SMS, ctas_per_sm=4, num_warps=warps)
    assert plan.num_programs == 0 and plan.program_items is None  # a shape asked for: the plan's as ever
    plan = plan_decode(ids, indptr, lens, fmt, 32, num_sms=H200_SMS, num_warps=warps)
    assert plan.num_programs == (programs or 0) and (plan.program_items is not None) == bool(programs)
    assert programs is None or plan.maxnreg is None
    monkeypatch.setattr(decode_plan, "_even_shares_on", lambda: False)
    assert plan_decode(ids, indptr, lens, fmt, 32, num_sms=H200_SMS).program_items is None


def test_the_launch_folds_the_padding_rows_where_they_are_padding() -> None:
    """launch.pads_hi through the launch's constexprs (lean.py's PAD_HI): on for the lean tile with a GQA
    group of at most 8, under the split cap too; off for a group of 16 (every MMA row real), without the lean
    tile, or when the caller asks to keep the padding rows' arithmetic."""
    from dataclasses import replace

    from zipkv.kernels.attention.decode_config import HOPPER_SPLIT_CAP
    from zipkv.kernels.attention.hopper.launch import _plan_constexprs

    fmt = PageFormat(head_dim=128, num_kv_heads=2, version=3)
    plan = _plan(fmt)  # 8 query heads over 2 KV heads: a group of 4
    lens = torch.tensor([40], dtype=torch.int32)
    indptr = torch.tensor([0, 3], dtype=torch.int32)
    full = plan_decode(torch.arange(3, dtype=torch.int32), indptr, lens, fmt, 32)  # a group of 16
    lean, not_lean = (False, False, True), (False, False, False)

    def folds(p, options=lean, pad_hi=None):  # type: ignore[no-untyped-def]
        consts, regs = _plan_constexprs(p, 2, False, options, None, pad_hi)
        return consts["PAD_HI"], regs

    assert (plan.group_size, full.group_size) == (4, 16)
    assert folds(plan) == (True, None)
    assert folds(replace(plan, maxnreg=HOPPER_SPLIT_CAP[1])) == (True, HOPPER_SPLIT_CAP[1])
    assert folds(full)[0] is False and folds(plan, options=not_lean)[0] is False
    assert folds(plan, pad_hi=False)[0] is False
