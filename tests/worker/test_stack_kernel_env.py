"""The worker's kernel choices set where the local stack starts reach its replicas' environment (and a
serving benchmark's record), and nothing else does."""

from __future__ import annotations

from zipkv.stack.options import KERNEL_CHOICE_ENV, kernel_choices


def test_only_the_kernel_choices_are_passed_on() -> None:
    env = {"ZIPKV_PREFILL_KERNEL": "flashinfer", "ZIPKV_PAGE_FORMAT": "3", "ZIPKV_REPORT_TOKEN": "s3cret",
           "HOME": "/root"}  # fmt: skip
    assert kernel_choices(env) == {"ZIPKV_PREFILL_KERNEL": "flashinfer", "ZIPKV_PAGE_FORMAT": "3"}
    assert kernel_choices({}) == {}


def test_every_choice_the_worker_reads_is_listed() -> None:
    from zipkv.allocator import pack
    from zipkv.kernels.attention import decode_config, decode_plan, extend
    from zipkv.worker.engines.sglang import flashinfer_prefill

    read = {decode_config.KERNEL_CONFIG_ENV, decode_config.DECODE_IMPL_ENV, decode_config.PAGE_FORMAT_ENV,
            decode_config.HOPPER_WARP_SOFTMAX_ENV, decode_config.HOPPER_LAZY_RESCALE_ENV,
            decode_config.HOPPER_LEAN_ENV, decode_config.HOPPER_SPLIT_CAP_ENV,
            decode_config.HOPPER_EVEN_SHARES_ENV, decode_config.HOPPER_PRODUCER_ENV,
            extend.EXTEND_KERNEL_ENV, flashinfer_prefill.PREFILL_KERNEL_ENV, pack.POOL_PACK_ENV,
            decode_plan.SPLIT_PLAN_ENV}  # fmt: skip
    assert read == set(KERNEL_CHOICE_ENV)
