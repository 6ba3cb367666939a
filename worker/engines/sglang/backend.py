"""zipkv's attention backend as SGLang sees it: a subclass of SGLang's ``AttentionBackend`` that hands each
forward batch to ``ZipkvAttention`` (attention.py) as a ``BatchView``.

Imports SGLang at module level: only seams.py imports this module, on demand, once SGLang is known to be
importable (the rest of the package stays importable without SGLang).
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from zipkv.worker.engines.sglang.attention import BatchView, ZipkvAttention
from zipkv.worker.engines.sglang.kv_pool import ZipkvKVCache


def view_of(fb: Any) -> BatchView:
    cpu, mode = fb.seq_lens_cpu, fb.forward_mode
    return BatchView(
        mode.is_decode(),
        mode.is_idle(),
        fb.batch_size,
        fb.req_pool_indices,
        fb.seq_lens,
        None if cpu is None else cpu.tolist(),
        # The decode CUDA graph's replay view (a SimpleNamespace, build_replay_fb_view) has no
        # extend fields: decode never reads them.
        getattr(fb, "extend_prefix_lens_cpu", None),
        getattr(fb, "extend_seq_lens_cpu", None),
    )


class ZipkvAttnBackend(AttentionBackend):
    def __init__(self, runner: Any, compressed: bool) -> None:
        pool = runner.token_to_kv_pool
        if not isinstance(pool, ZipkvKVCache):
            raise RuntimeError(
                "the zipkv attention backend needs the zipkv KV pool; was the zipkv plugin "
                "loaded in the scheduler process? (pip install zipkv; SGLANG_PLUGINS)"
            )
        if runner.use_mla_backend or runner.model_config.is_encoder_decoder or runner.sliding_window_size:
            raise NotImplementedError("zipkv serves decoder-only MHA/GQA models without sliding windows")
        self.token_to_kv_pool = pool
        self.req_to_token_pool = runner.req_to_token_pool
        self.forward_metadata = None
        # This rank's query heads: under tensor parallelism q arrives with its share only (SGLang's own
        # backends divide the same way).
        heads = runner.model_config.get_num_attention_heads(runner.server_args.tp_size)
        self.impl = ZipkvAttention(
            pool.kv,
            runner.token_to_kv_pool_allocator,
            runner.req_to_token_pool.req_to_token,
            heads,
            compressed,
            extend_attention_fwd,
        )

    def init_forward_metadata(self, forward_batch: Any) -> None:
        self.impl.begin_step(view_of(forward_batch), torch.cuda.is_current_stream_capturing())

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        if not in_capture:
            self.impl.allocator.compress_step()
        self.impl.graph_fill_table(view_of(forward_batch))

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        self.impl.graph_plan(view_of(forward_batch))

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.impl.init_graph_state(max_bs, self.token_to_kv_pool.pool.device)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def _check(self, layer: Any) -> None:
        if layer.logit_cap or getattr(layer, "k_scale", None) is not None:
            raise NotImplementedError("zipkv attention has no logit cap or KV scales")

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):  # type: ignore[no-untyped-def]
        self._check(layer)
        if save_kv_cache and k is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        return self.impl.decode(q, layer.layer_id, layer.scaling)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):  # type: ignore[no-untyped-def]
        self._check(layer)
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        return self.impl.extend(q, k, v, layer.layer_id, layer.scaling)
