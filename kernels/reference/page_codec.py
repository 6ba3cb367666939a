"""The public reference codec: encode and decode page-heads and pages in any supported format version.

Plain torch, CPU or GPU tensors, bit-exact; it is what the format study (``python -m zipkv.kernels.study``)
measures stored bytes with and what the tests hold the Triton codec and the decode kernels to. Versions 1
and 2 (``kernels/format/layout.py``: 512-value blocks, offsets in the metadata) go through
``kernels/reference/pages.py``, version 3 (``kernels/format/layout_v3.py``: blocks of 16 tokens x 4 channel
pairs, fixed-size page-head records, patches) through ``kernels/reference/pages_v3.py``.

A **page-head** is one KV head's K (``kv=0``) or V (``kv=1``) in one page: bf16 ``[16, head_dim]``,
head_dim 64, 128 or 256. A **page** is ``[2, num_kv_heads, 16, head_dim]`` (K then V). Usage::

    from zipkv.kernels.reference import page_codec

    enc = page_codec.encode_page_head(values, kv=0, version=3)   # values: bf16 [16, 128]
    enc.data, enc.meta            # the bytes stored in the page, the page-head's metadata row
    enc.stored_bytes, enc.meta_bytes, enc.coded_blocks, enc.blocks
    assert torch.equal(page_codec.decode_page_head(enc), values)  # bit for bit, NaN payloads included

    fmt = PageFormat(head_dim=64, num_kv_heads=3, version=3)
    page = page_codec.encode_pages(pages, fmt)[0]    # pages: bf16 [n, 2, 3, 16, 64]
    page.stored_bytes == fmt.compressed_page_bytes(page.coded_blocks)

Sizes always agree with ``PageFormat``; a v3 page stored raw (all its blocks raw, or more raw blocks than
patches allow) is plain bf16 and counts as raw bytes, with no coded block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format import layout_v3 as v3
from ..format.layout import FORMAT_VERSION, PAGE_TOKENS, SUPPORTED_HEAD_DIMS, SUPPORTED_VERSIONS, PageFormat
from . import pages as ref
from . import pages_v3 as ref3


@dataclass(frozen=True)
class EncodedPageHead:
    """One page-head in a page format version: its stored bytes, its metadata row and their sizes."""

    version: int
    kv: int  # 0 = K, 1 = V
    head_dim: int
    data: torch.Tensor  # uint8 [stored_bytes]: v1/v2 its blocks; v3 its record then its raw blocks' patches
    meta: torch.Tensor  # uint8 [meta_bytes]: the page-head's metadata row (v1/v2 offset 0: a page of its own)
    coded_blocks: int  # blocks stored coded (low bytes + 4-bit codes); the others are raw

    @property
    def fmt(self) -> PageFormat:
        return PageFormat(self.head_dim, 1, version=self.version)

    @property
    def blocks(self) -> int:
        return self.fmt.blocks_per_page_head

    @property
    def stored_bytes(self) -> int:
        return int(self.data.numel())

    @property
    def meta_bytes(self) -> int:
        return int(self.meta.numel())

    @property
    def raw_bytes(self) -> int:
        """What the page-head holds as plain bf16."""
        return 2 * PAGE_TOKENS * self.head_dim

    @property
    def coded_fraction(self) -> float:
        """Fraction of the page-head's values stored coded (every block holds as many values)."""
        return self.coded_blocks / self.blocks


@dataclass(frozen=True)
class EncodedPage:
    """One page in a page format version: its stored bytes, metadata and, per page-head, its share."""

    fmt: PageFormat
    data: torch.Tensor  # uint8 [stored_bytes]: what the page occupies in the heap
    meta: torch.Tensor  # uint8 [2H, meta_bytes]: the page's metadata rows
    stored_raw: bool  # every block raw (v3: the page is plain [2, H, 16, D] bf16)
    # Per page-head (K h0 .. V hH-1): stored bytes (summing to stored_bytes; v3 patches count towards the
    # page-head whose block they patch) and coded blocks (0 in a page stored raw).
    page_head_bytes: tuple[int, ...]
    page_head_coded_blocks: tuple[int, ...]

    @property
    def coded_blocks(self) -> int:
        return sum(self.page_head_coded_blocks)

    @property
    def stored_bytes(self) -> int:
        return int(self.data.numel())

    @property
    def meta_bytes(self) -> int:
        return int(self.meta.numel())

    @property
    def coded_fraction(self) -> float:
        return self.coded_blocks / self.fmt.blocks_per_page


def _check_version(version: int, head_dim: int, kv: int) -> None:
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"page format version {version} unknown; use one of {SUPPORTED_VERSIONS}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} not supported; use one of {SUPPORTED_HEAD_DIMS}")
    if kv not in (0, 1):
        raise ValueError(f"kv must be 0 (K) or 1 (V), got {kv}")


def _check_values(values: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if values.dtype != torch.bfloat16 or tuple(values.shape[-len(shape) :]) != shape:
        raise ValueError(f"expected bf16 {what} [..., {', '.join(map(str, shape))}], got "
                         f"{values.dtype} {list(values.shape)}")  # fmt: skip


def encode_page_head(values: torch.Tensor, kv: int, version: int = FORMAT_VERSION) -> EncodedPageHead:
    """bf16 ``[16, head_dim]`` K (kv=0) or V (kv=1) values -> the page-head in format ``version``."""
    head_dim = int(values.shape[-1]) if values.dim() == 2 else -1
    _check_values(values, (PAGE_TOKENS, head_dim), "page-head")
    _check_version(version, head_dim, kv)
    fmt = PageFormat(head_dim, 1, version=version)
    if version >= 3:
        heads = ref3.encode_page_heads(values[None], kv)
        coded = heads.coded[0]
        if not bool(coded.any()):  # stored raw: plain bf16, every metadata byte the raw-page marker
            data = values.contiguous().view(torch.uint8).reshape(-1)
            meta = torch.full((fmt.meta_bytes,), v3.RAW_PAGE_MARKER, dtype=torch.uint8, device=values.device)
            return EncodedPageHead(version, kv, head_dim, data, meta, 0)
        raw = ~coded
        rank = torch.cumsum(raw.to(torch.int32), 0) - 1
        meta = torch.where(raw, v3.RAW_BLOCK_FLAG | rank.clamp(min=0), heads.half_base[0].to(torch.int32))
        data = torch.cat([heads.records[0], heads.patches[0][raw].reshape(-1)])
        return EncodedPageHead(version, kv, head_dim, data, meta.to(torch.uint8), int(coded.sum()))
    geometry = fmt.geometry(kv)
    blocks = ref.page_to_blocks(values, geometry)
    encoded = ref.encode_blocks(blocks, geometry, fmt.paired_low_bytes)
    offsets = torch.zeros(1, dtype=torch.int64, device=values.device)
    meta = ref.pack_meta(offsets, encoded.markers[None], fmt)[0]
    coded_blocks = int((encoded.markers != ref.RAW_MARKER).sum())
    return EncodedPageHead(version, kv, head_dim, encoded.data, meta, coded_blocks)


def decode_page_head(encoded: EncodedPageHead) -> torch.Tensor:
    """Inverse of :func:`encode_page_head`: bf16 ``[16, head_dim]``, bit-identical."""
    d, kv, meta = encoded.head_dim, encoded.kv, encoded.meta
    _check_version(encoded.version, d, kv)
    if encoded.meta_bytes != encoded.fmt.meta_bytes:
        raise ValueError(f"a v{encoded.version} page-head has {encoded.fmt.meta_bytes} metadata bytes, "
                         f"got {encoded.meta_bytes}")  # fmt: skip
    if encoded.version >= 3:
        if int(meta[0]) == v3.RAW_PAGE_MARKER:
            return encoded.data.view(torch.bfloat16).view(PAGE_TOKENS, d).clone()
        return _decode_v3_page_head(encoded)
    blocks = ref.decode_blocks(
        ref.EncodedBlocks(
            encoded.data, meta[4 : 4 + encoded.blocks], encoded.fmt.geometry(kv), encoded.fmt.paired_low_bytes
        )
    )
    return ref.blocks_to_page(blocks, encoded.fmt.geometry(kv), d)


def _decode_v3_page_head(encoded: EncodedPageHead) -> torch.Tensor:
    """A coded v3 page-head: its record, then the patches of its raw blocks in rank order."""
    d, m = encoded.head_dim, encoded.meta.to(torch.int32)
    raw = m >= v3.RAW_BLOCK_FLAG
    n_raw, record_bytes = int(raw.sum()), v3.page_head_bytes(d)
    if encoded.stored_bytes != record_bytes + v3.PATCH_BYTES * n_raw:
        raise ValueError(f"a v3 page-head with {n_raw} raw blocks stores {record_bytes + 64 * n_raw} bytes, "
                         f"got {encoded.stored_bytes}: corrupt metadata?")  # fmt: skip
    ranks = (m[raw] & 0x7F).to(torch.int64)
    if n_raw and int(ranks.max()) >= n_raw:
        raise ValueError("a raw block's patch rank points past the page-head's patches: corrupt metadata?")
    patches = torch.zeros(m.numel(), v3.PATCH_BYTES, dtype=torch.uint8, device=m.device)
    patches[raw] = encoded.data[record_bytes:].view(n_raw, v3.PATCH_BYTES)[ranks]
    heads = ref3.PageHeads(encoded.data[None, :record_bytes], ~raw[None],
                           torch.where(raw, 0, m).to(torch.uint8)[None], patches[None])  # fmt: skip
    return ref3.decode_page_heads(heads, encoded.kv)[0]


def _page_head_bytes(meta: torch.Tensor, fmt: PageFormat, stored_raw: bool) -> tuple[int, ...]:
    """Stored bytes of each page-head of a page, from its metadata rows uint8 [2H, meta_bytes]."""
    if fmt.version >= 3:
        if stored_raw:
            return (fmt.raw_page_head_bytes,) * fmt.page_heads_per_page
        n_raw = (meta.to(torch.int32) >= v3.RAW_BLOCK_FLAG).sum(dim=1)
        return tuple(int(v3.page_head_bytes(fmt.head_dim) + v3.PATCH_BYTES * n) for n in n_raw)
    _, markers = ref.unpack_meta(meta, fmt)
    return tuple(int(s) for s in ref.block_sizes(markers).sum(dim=1))


def _encode_pages_v12(pages: torch.Tensor, fmt: PageFormat) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """v1/v2 pages in one vectorised call: raw pages into a scratch heap, reference.encode_pages (the
    Triton codec's twin) compacts each into its own raw-size slot after them."""
    n, raw = pages.shape[0], fmt.raw_page_bytes
    heap = torch.zeros(2 * n * raw, dtype=torch.uint8, device=pages.device)
    index = ref.raw_page_value_index(fmt, pages.device).reshape(-1)
    heap[: n * raw].view(torch.bfloat16).view(n, -1)[:, index] = pages.reshape(n, -1)
    src = torch.arange(n, dtype=torch.int64, device=pages.device) * raw
    meta = torch.empty(n, fmt.page_heads_per_page, fmt.meta_bytes, dtype=torch.uint8, device=pages.device)
    sizes = torch.empty(n, dtype=torch.int32, device=pages.device)
    ref.encode_pages(heap, src, src + n * raw, meta, sizes, fmt)
    stored = [heap[(n + i) * raw : (n + i) * raw + int(size)].clone() for i, size in enumerate(sizes)]
    return stored, list(meta)


def encode_pages(pages: torch.Tensor, fmt: PageFormat) -> list[EncodedPage]:
    """bf16 ``[n, 2, H, 16, D]`` pages -> each page as stored in ``fmt`` (its version and geometry)."""
    _check_values(pages, (2, fmt.num_kv_heads, PAGE_TOKENS, fmt.head_dim), "pages")
    if fmt.version >= 3:
        stored, meta = ref3.encode_pages_v3(pages.reshape(-1, *pages.shape[-4:]), fmt)
        metas = list(meta)
    else:
        stored, metas = _encode_pages_v12(pages.reshape(-1, *pages.shape[-4:]), fmt)
    out = []
    for data, m in zip(stored, metas, strict=True):
        if fmt.version >= 3:
            stored_raw = int(m[0, 0]) == v3.RAW_PAGE_MARKER
            coded = torch.zeros(fmt.page_heads_per_page) if stored_raw else (m < v3.RAW_BLOCK_FLAG).sum(dim=1)
        else:
            coded = (ref.unpack_meta(m, fmt)[1] != ref.RAW_MARKER).sum(dim=1)
            stored_raw = not bool(coded.any())
        out.append(EncodedPage(fmt, data, m, stored_raw, _page_head_bytes(m, fmt, stored_raw),
                               tuple(int(c) for c in coded)))  # fmt: skip
    return out


def decode_page(page: EncodedPage) -> torch.Tensor:
    """Inverse of :func:`encode_pages` for one page: bf16 ``[2, H, 16, D]``, bit-identical."""
    if page.fmt.version >= 3:
        return ref3.decode_pages_v3([page.data], page.meta[None], page.fmt)[0]
    return ref.decode_page(page.data, page.meta, page.fmt)
