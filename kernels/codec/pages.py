"""Triton codec for the zipkv page format (kernels/format/layout.py): encode full pages, decode pages, store
tokens.

The public entry points: each wrapper checks its tensors, then makes one launch with no host sync. The
kernels live beside this module, the writer in codec/encode.py and the reader in codec/restore.py (see their
docstrings for how each walks a page); page format v3's two in codec/v3.py, picked by ``fmt.version`` so
callers do not change with the format. Each kernel has a plain-torch twin in kernels/reference/pages.py (v3's
in reference/pages_v3.py) and is tested against it bit for bit, compiled on the GPU and under
``TRITON_INTERPRET=1`` on the CPU. Every block geometry of format/layout.py is handled by index arithmetic
(the K and V geometries are constexpr). The codec is integer-only: nothing here does bf16 math.
"""

from __future__ import annotations

import os

import torch

from ..format.layout import PAGE_TOKENS, PageFormat, token_major
from .encode import _encode_pages_kernel, _store_tokens_kernel
from .restore import _decode_pages_kernel
from .v3 import _decode_pages_v3_kernel, _encode_pages_v3_kernel

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ---- wrappers -----------------------------------------------------------------------------------------


def _check_heap(heap: torch.Tensor) -> None:
    if heap.dtype != torch.uint8 or heap.dim() != 1 or heap.numel() % 4 != 0:
        raise ValueError(
            f"heap must be a 1-D uint8 tensor of a multiple of 4 bytes, got {heap.dtype} {list(heap.shape)}"
        )
    if heap.device.type != "cuda" and not _INTERPRET:
        raise RuntimeError(
            "the Triton codec needs a CUDA device; on the CPU set TRITON_INTERPRET=1 before importing "
            "zipkv.kernels.codec.pages, or use zipkv.kernels.reference.pages"
        )


def _check(
    name: str, x: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device
) -> None:
    if x.dtype != dtype or tuple(x.shape) != shape or x.device != device or not x.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {dtype} tensor of shape {list(shape)} on {device}, "
            f"got {x.dtype} {list(x.shape)} on {x.device}"
        )


def _rows_contiguous(x: torch.Tensor) -> bool:
    """Whether each token of ``x`` ([n, H, D]) has its H x D values one after another (tokens any stride
    apart): the layout ``store_tokens`` reads."""
    return x.dim() == 3 and x.stride(2) == 1 and (x.shape[1] == 1 or x.stride(1) == x.shape[2])


def as_token_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` ([n, H, D]) itself when ``store_tokens`` can read it in place (a slice of the QKV projection's
    output), else a contiguous copy."""
    return x if _rows_contiguous(x) else x.contiguous()


def _check_rows(name: str, x: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    """A bf16 [n, H, D] tensor whose tokens may lie any stride apart, each token's H x D values contiguous."""
    rows_ok = _rows_contiguous(x)
    if x.dtype != torch.bfloat16 or tuple(x.shape) != shape or x.device != device or not rows_ok:
        raise ValueError(
            f"{name} must be a bf16 tensor of shape {list(shape)} on {device} with each token's values "
            f"contiguous, got {x.dtype} {list(x.shape)} strides {list(x.stride())} on {x.device}"
        )


def _geometry_args(fmt: PageFormat) -> dict[str, int]:
    """The block geometry a raw page is laid out in: v3's raw pages are plain [2, H, 16, D] bf16, which is
    v1/v2's token-major raw page."""
    k, v = (token_major(fmt.head_dim),) * 2 if fmt.version >= 3 else (fmt.k_geometry, fmt.v_geometry)
    return {"KR": k.tokens, "KC": k.channels, "VR": v.tokens, "VC": v.channels}


def _check_aligned(fmt: PageFormat, **offsets: torch.Tensor) -> None:
    """Offsets off the kernels' alignment would read wrong bytes. Checked where it costs no device sync:
    under the interpreter (the CPU); on the GPU the callers (the allocator) guarantee it."""
    if not _INTERPRET:
        return
    align = fmt.page_alignment_bytes
    for name, x in offsets.items():
        if bool((x % align != 0).any()):
            raise ValueError(f"{name} must be multiples of {align} bytes for page format v{fmt.version}")


def encode_pages(
    heap: torch.Tensor,
    src_offsets: torch.Tensor,
    dst_offsets: torch.Tensor,
    meta_out: torch.Tensor,
    sizes_out: torch.Tensor,
    fmt: PageFormat,
    num_warps: int = 4,
) -> None:
    """Compress n full raw pages at byte ``src_offsets`` (int64 [n]) into ``dst_offsets`` (int64 [n]).

    Writes each page's metadata into ``meta_out`` (uint8 [n, 2H, meta_bytes]) and its stored size in bytes
    (metadata excluded) into ``sizes_out`` (int32 [n]). One launch, no host sync. Offsets must be multiples
    of ``fmt.page_alignment_bytes`` (v1/v2 256, v3 16); each destination needs room for
    ``fmt.raw_page_bytes`` and must not overlap any source page. v3 (codec/v3.py) writes each page's
    records then its raw blocks' patches in rank order, or the raw page again when it stores raw.
    """
    _check_heap(heap)
    n = src_offsets.numel()
    dev = heap.device
    _check("src_offsets", src_offsets, torch.int64, (n,), dev)
    _check("dst_offsets", dst_offsets, torch.int64, (n,), dev)
    _check("meta_out", meta_out, torch.uint8, (n, fmt.page_heads_per_page, fmt.meta_bytes), dev)
    _check("sizes_out", sizes_out, torch.int32, (n,), dev)
    if n == 0:
        return
    _check_aligned(fmt, src_offsets=src_offsets, dst_offsets=dst_offsets)
    if fmt.version >= 3:
        _encode_pages_v3_kernel[(n,)](
            heap.view(torch.int16), heap, src_offsets, dst_offsets, meta_out, sizes_out, fmt.num_kv_heads,
            D=fmt.head_dim, num_warps=num_warps,
        )  # fmt: skip
        return
    _encode_pages_kernel[(n,)](
        heap.view(torch.int16), heap, src_offsets, dst_offsets, meta_out, sizes_out,
        fmt.num_kv_heads, fmt.raw_page_head_bytes, NB=fmt.blocks_per_page_head, META_BYTES=fmt.meta_bytes,
        PAIRED=fmt.paired_low_bytes, num_warps=num_warps, **_geometry_args(fmt),
    )  # fmt: skip


def decode_pages(
    heap: torch.Tensor,
    offsets: torch.Tensor,
    meta: torch.Tensor,
    out: torch.Tensor,
    fmt: PageFormat,
    num_warps: int = 4,
    use_prmt: bool | None = None,
    page_heads_per_program: int = 1,
    stream_stores: bool = False,
) -> None:
    """Restore n pages (raw or compressed) at byte ``offsets`` (int64 [n]) with metadata ``meta``
    (uint8 [n, 2H, meta_bytes]) into ``out`` (bf16 [n, 2, H, 16, D]). One launch, no host sync.

    Offsets must be multiples of ``fmt.page_alignment_bytes`` (v1/v2 256, v3 16: the kernels read whole
    16-byte vectors). ``use_prmt`` picks the PTX byte interleave of v1/v2 (GPU only); by default it is on
    when compiled and off under the interpreter. v3's restore (codec/v3.py) has no such choice."""
    _check_heap(heap)
    n = offsets.numel()
    dev = heap.device
    h, d = fmt.num_kv_heads, fmt.head_dim
    _check("offsets", offsets, torch.int64, (n,), dev)
    _check("meta", meta, torch.uint8, (n, 2 * h, fmt.meta_bytes), dev)
    _check("out", out, torch.bfloat16, (n, 2, h, PAGE_TOKENS, d), dev)
    g = page_heads_per_program
    if g < 1 or h % g != 0 or g & (g - 1):
        raise ValueError(f"page_heads_per_program must be a power of two dividing num_kv_heads {h}, got {g}")
    if fmt.version >= 3 and use_prmt:
        raise ValueError("use_prmt picks v1/v2's byte interleave; page format v3's restore has none")
    if n == 0:
        return
    _check_aligned(fmt, offsets=offsets)
    if fmt.version >= 3:
        _decode_pages_v3_kernel[(n, 2 * h // g)](
            heap, heap.view(torch.int16), offsets, meta, out.view(torch.int16), h, D=d, G=g,
            STREAM=stream_stores, num_warps=num_warps,
        )  # fmt: skip
        return
    if use_prmt is None:
        use_prmt = not _INTERPRET
    _decode_pages_kernel[(n, 2 * h // g)](
        heap.view(torch.int32), offsets, meta, meta.view(torch.int32), out.view(torch.int32), h, D=d,
        NB=fmt.blocks_per_page_head, META_BYTES=fmt.meta_bytes, G=g, USE_PRMT=use_prmt, STREAM=stream_stores,
        PAIRED=fmt.paired_low_bytes, num_warps=num_warps, **_geometry_args(fmt),
    )  # fmt: skip


def store_tokens(
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fmt: PageFormat,
) -> None:
    """Write tokens ``k``, ``v`` (bf16 [n, H, D]) into their raw pages; ``slot = page_id * 16 + offset``.
    ``k`` and ``v`` may be views whose tokens lie any stride apart (each token's heads contiguous): SGLang
    hands over slices of the QKV projection, and copying them cost two launches a layer and step (the H100
    profile, docs/benchmarks.md)."""
    _check_heap(heap)
    n = slots.numel()
    dev = heap.device
    h, d = fmt.num_kv_heads, fmt.head_dim
    _check("slots", slots, torch.int64, (n,), dev)
    _check_rows("k", k, (n, h, d), dev)
    _check_rows("v", v, (n, h, d), dev)
    if page_loc_layer.dtype != torch.int64 or page_loc_layer.device != dev:
        raise ValueError(
            f"page_loc_layer must be int64 on {dev}, got {page_loc_layer.dtype} on {page_loc_layer.device}"
        )
    if n == 0:
        return
    _store_tokens_kernel[(n, 2 * h)](
        heap.view(torch.int16), page_loc_layer, slots, k.view(torch.int16), v.view(torch.int16), h,
        k.stride(0), v.stride(0), D=d, num_warps=1, **_geometry_args(fmt),
    )  # fmt: skip
