"""The SGLang seams as data: every SGLang function, method and class field zipkv relies on (sglang 0.5.17).

Each row names an SGLang module, a qualified name, and the parameters we call or override it with (or, for a
class, the attributes we read). tests/worker/test_sglang_seams.py checks every row against the real SGLang
source, so an upgrade that moves a seam fails a test instead of a GPU run. Data only, no sglang import: the
code that imports and patches SGLang stays in seams.py (the one module that touches SGLang
internals), which re-exports `SEAMS`, `Seam` and `SGLANG_VERSION` (version.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Seam:
    """A function or method of SGLang and the parameters we call it with or override it by.

    ``params`` as Python spells them: ``*`` marks the start of keyword-only parameters, ``*args`` and
    ``**kwargs`` keep their stars. ``fields``: for a class, attributes (dataclass fields) we read instead.
    """

    module: str
    qualname: str
    params: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()


# module | qualname | parameters (functions, methods) | fields (classes: attributes we read)
_SEAM_TABLE = """
sglang.srt.plugins | load_plugins | |
sglang.srt.layers.attention.attention_registry | register_attention_backend | name |
sglang.srt.server_args | add_attention_backend_choices | choices |
sglang.srt.server_args | ServerArgs.get_attention_backends | self |
sglang.srt.server_args | ServerArgs | | attention_backend prefill_attention_backend decode_attention_backend \
    page_size tp_size max_total_tokens disable_radix_cache chunked_prefill_size disable_overlap_schedule \
    disable_cuda_graph disable_prefill_cuda_graph cuda_graph_max_bs_decode kv_cache_dtype dtype \
    enable_trace otlp_traces_endpoint pp_size enable_dp_attention
sglang.srt.layers.attention.base_attn_backend | AttentionBackend.forward | \
    self q k v layer forward_batch save_kv_cache **kwargs |
sglang.srt.layers.attention.base_attn_backend | AttentionBackend.forward_decode | \
    self q k v layer forward_batch save_kv_cache **kwargs |
sglang.srt.layers.attention.base_attn_backend | AttentionBackend.forward_extend | \
    self q k v layer forward_batch save_kv_cache **kwargs |
sglang.srt.layers.attention.base_attn_backend | AttentionBackend.init_forward_metadata | self forward_batch |
sglang.srt.layers.attention.base_attn_backend | AttentionBackend.init_forward_metadata_out_graph | \
    self forward_batch in_capture |
sglang.srt.layers.attention.base_attn_backend | AttentionBackend.init_forward_metadata_in_graph | \
    self forward_batch |
sglang.srt.layers.attention.base_attn_backend | AttentionBackend.init_cuda_graph_state | \
    self max_bs max_num_tokens |
sglang.srt.layers.attention.base_attn_backend | AttentionBackend.get_cuda_graph_seq_len_fill_value | self |
sglang.kernels.ops.attention.extend_attention | extend_attention_fwd | q_extend k_extend v_extend o_extend \
    k_buffer v_buffer qo_indptr kv_indptr kv_indices custom_mask is_causal mask_indptr max_len_extend \
    k_scale v_scale sm_scale logit_cap skip_prefix_custom_mask sliding_window_size sinks window_kv_offsets \
    xai_temperature_len lse_extend skip_prefix skip_extend page_size score_mod aux_tensors |
sglang.kernels.ops.memory.allocator | alloc_extend_kernel | \
    pre_lens_ptr seq_lens_ptr last_loc_ptr free_page_ptr out_indices bs_upper page_size |
sglang.srt.mem_cache.memory_pool | KVCache.__init__ | self size page_size dtype layer_num device \
    enable_memory_saver start_layer end_layer allocation_label |
sglang.srt.mem_cache.memory_pool | KVCache._finalize_allocation_log | self num_tokens |
sglang.srt.mem_cache.memory_pool | MHATokenToKVPool.set_kv_buffer | self layer loc_info cache_k cache_v \
    k_scale v_scale layer_id_override dcp_kv_mask |
sglang.srt.mem_cache.memory_pool | unwrap_write_loc | loc_info |
sglang.srt.mem_cache.allocator.base | BaseTokenToKVPoolAllocator.__init__ | \
    self size page_size dtype device kvcache need_sort |
sglang.srt.mem_cache.allocator.paged | PagedTokenToKVPoolAllocator.alloc_extend | self prefix_lens \
    prefix_lens_cpu seq_lens seq_lens_cpu last_loc extend_num_tokens num_new_pages |
sglang.srt.mem_cache.allocator.paged | PagedTokenToKVPoolAllocator.alloc_decode | \
    self seq_lens seq_lens_cpu last_loc |
sglang.srt.mem_cache.allocator.paged | PagedTokenToKVPoolAllocator.free | self free_index |
sglang.srt.mem_cache.allocator.paged | PagedTokenToKVPoolAllocator.free_segment | \
    self free_index * start_pos |
sglang.srt.mem_cache.kv_cache_configurator | KVCacheConfigurator._build_mha_kv_pool | \
    self * max_total_num_tokens mha_pool_class quant_method |
sglang.srt.mem_cache.kv_cache_configurator | KVCacheConfigurator._build_token_to_kv_pool_allocator | \
    self * sizes token_to_kv_pool is_dsv4_model req_to_token_pool token_to_kv_pool_allocator |
sglang.srt.mem_cache.kv_cache_configurator | KVCacheConfigurator | | \
    device model_config server_args kv_cache_dtype layer_info
sglang.srt.configs.model_config | ModelConfig.get_num_kv_heads | self tensor_parallel_size |
sglang.srt.configs.model_config | ModelConfig.get_num_attention_heads | self tensor_parallel_size |
sglang.srt.managers.scheduler_components.invariant_checker | SchedulerInvariantChecker._check_full_pool | \
    self ps uncached |
sglang.srt.managers.scheduler_components.invariant_checker | SchedulerInvariantChecker | | \
    tree_cache token_to_kv_pool_allocator pool_stats_observer
sglang.srt.managers.scheduler | Scheduler.get_new_batch_prefill | self running_batch |
sglang.srt.managers.scheduler | Scheduler | | tree_cache token_to_kv_pool_allocator tp_cpu_group
sglang.srt.managers.scheduler | Scheduler.get_next_batch_to_run | self running_batch last_batch |
sglang.srt.mem_cache.base_prefix_cache | BasePrefixCache.evict | self params |
sglang.srt.mem_cache.base_prefix_cache | BasePrefixCache.evictable_size | self |
sglang.srt.mem_cache.base_prefix_cache | BasePrefixCache.is_chunk_cache | self |
sglang.srt.mem_cache.base_prefix_cache | EvictParams | | num_tokens
sglang.srt.mem_cache.base_prefix_cache | EvictResult | | num_tokens_evicted
sglang.srt.managers.schedule_batch | ScheduleBatch | | batch_is_full token_to_kv_pool_allocator
sglang.srt.managers.schedule_batch | ScheduleBatch.check_decode_mem | self selected_indices |
sglang.srt.managers.schedule_batch | ScheduleBatch.new_tokens_required_next_decode | self selected_indices |
sglang.srt.managers.scheduler | run_scheduler_process | server_args port_args gpu_id tp_rank attn_cp_rank \
    moe_dp_rank moe_ep_rank pp_rank dp_rank pipe_writer display_tp_rank display_dp_rank display_moe_ep_rank |
sglang.srt.model_executor.forward_batch_info | ForwardBatch | | forward_mode batch_size req_pool_indices \
    seq_lens out_cache_loc seq_lens_cpu extend_prefix_lens_cpu extend_seq_lens_cpu
sglang.srt.entrypoints.engine | Engine | | run_scheduler_process_func server_args_class
sglang.srt.entrypoints.engine | Engine.async_generate | self prompt sampling_params input_ids image_data \
    audio_data video_data mm_hashes return_logprob logprob_start_len top_logprobs_num token_ids_logprob \
    lora_path custom_logit_processor require_reasoning return_hidden_states return_routed_experts \
    routed_experts_start_len stream bootstrap_host bootstrap_port bootstrap_room routed_dp_rank \
    disagg_prefill_dp_rank data_parallel_rank external_trace_header rid session_params priority session_id |
sglang.srt.entrypoints.engine | Engine.shutdown | self |
sglang.srt.entrypoints.engine | Engine.generate | self prompt sampling_params input_ids image_data \
    audio_data video_data mm_hashes return_logprob logprob_start_len top_logprobs_num token_ids_logprob \
    lora_path custom_logit_processor require_reasoning return_hidden_states return_routed_experts \
    routed_experts_start_len stream bootstrap_host bootstrap_port bootstrap_room routed_dp_rank \
    disagg_prefill_dp_rank data_parallel_rank external_trace_header rid session_params priority session_id |
sglang.srt.managers.tokenizer_manager | TokenizerManager.abort_request | self rid abort_all |
sglang.srt.managers.tokenizer_control_mixin | TokenizerControlMixin.get_loads | self include dp_rank |
sglang.srt.managers.load_snapshot | LoadSnapshot | | num_running_reqs num_waiting_reqs num_used_tokens \
    max_total_num_tokens
"""


def _parse_seams(table: str) -> tuple[Seam, ...]:
    rows = table.strip().splitlines()  # a backslash-newline in the table joins lines
    out = []
    for row in rows:
        module, qualname, params, fields = (part.strip() for part in row.split("|"))
        out.append(Seam(module, qualname, tuple(params.split()), tuple(fields.split())))
    return tuple(out)


SEAMS: tuple[Seam, ...] = _parse_seams(_SEAM_TABLE)
