"""The pages bench/kernels/bench_codec.py times, and the checks it runs before timing them.

The data (real KV tiled to the bench's shape, or synthetic pages), a heap holding them raw with room for
their compressed copies, the Triton encode and decode calls on that heap, and the bit-for-bit checks of
both against the torch reference. The timing and the report stay in bench_codec.py; this module holds what
is timed, so that a check and the call it checks are side by side.

Import it after TRITON_INTERPRET is set where it is wanted (bench_codec.py sets it on a CPU): the codec's
kernels read it when zipkv.kernels.codec.pages is first imported.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from bench.kernels.real_kv import tile_pages
from zipkv.kernels.codec import pages as codec
from zipkv.kernels.format import layout_v3 as v3
from zipkv.kernels.format.layout import OFFSET_BYTES, RAW_MARKER, PageFormat
from zipkv.kernels.reference import pages as ref


def make_pages(kind: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """bf16 pages: 'real' tiled real KV; synthetic 'normal' N(0, 1), 'compressible' one exponent window,
    'raw' random bit patterns."""
    dev = gen.device
    if kind == "real":
        return tile_pages(shape[0], shape[2], shape[4], device=str(dev))
    if kind == "normal":
        return torch.randn(shape, generator=gen, device=dev).bfloat16()
    if kind == "compressible":
        return (torch.rand(shape, generator=gen, device=dev) + 1.0).bfloat16()
    bits = torch.randint(-(2**15), 2**15, shape, generator=gen, device=dev, dtype=torch.int16)
    return bits.view(torch.bfloat16)


def coded_blocks(meta: torch.Tensor, fmt: PageFormat) -> int:
    """Blocks stored compressed, from the encoder's metadata (uint8 [n, 2H, meta_bytes])."""
    if fmt.version >= 3:
        return int((meta < v3.RAW_BLOCK_FLAG).sum())  # b/2; raw blocks 0x80 | rank, raw pages 0xFF
    return int((meta[:, :, OFFSET_BYTES : OFFSET_BYTES + fmt.blocks_per_page_head] != RAW_MARKER).sum())


@dataclass(frozen=True)
class DecodeConfig:
    page_heads_per_program: int
    num_warps: int
    use_prmt: bool = True
    stream_stores: bool = False

    @property
    def name(self) -> str:
        interleave = "prmt" if self.use_prmt else "int"
        return f"g{self.page_heads_per_program}-w{self.num_warps}-{interleave}" + (
            "-cs" if self.stream_stores else ""
        )


class Setup:
    """A heap holding n raw pages (sources) and room for their compressed copies (destinations)."""

    def __init__(self, fmt: PageFormat, pages: torch.Tensor) -> None:
        n, dev = pages.shape[0], pages.device
        raw = fmt.raw_page_bytes
        self.fmt, self.n, self.pages = fmt, n, pages
        self.heap = torch.zeros(2 * n * raw, dtype=torch.uint8, device=dev)
        index = ref.raw_page_value_index(fmt, dev).view(-1)
        raw_values = self.heap[: n * raw].view(torch.bfloat16).view(n, -1)
        raw_values[:, index] = pages.reshape(n, -1)
        self.src = torch.arange(n, device=dev, dtype=torch.int64) * raw
        self.dst = self.src + n * raw
        self.meta = torch.empty(n, fmt.page_heads_per_page, fmt.meta_bytes, dtype=torch.uint8, device=dev)
        self.sizes = torch.empty(n, dtype=torch.int32, device=dev)
        self.raw_meta = ref.raw_page_meta(fmt, dev).expand(n, -1, -1).contiguous()
        self.out = torch.empty_like(pages)

    def encode(self, num_warps: int) -> None:
        codec.encode_pages(
            self.heap, self.src, self.dst, self.meta, self.sizes, self.fmt, num_warps=num_warps
        )

    def decode(self, config: DecodeConfig, raw: bool = False) -> None:
        offsets, meta = (self.src, self.raw_meta) if raw else (self.dst, self.meta)
        codec.decode_pages(self.heap, offsets, meta, self.out, self.fmt, num_warps=config.num_warps,
                           use_prmt=config.use_prmt, page_heads_per_program=config.page_heads_per_program,
                           stream_stores=config.stream_stores)  # fmt: skip

    def check_encode(self, sample: int = 48) -> None:
        picks = torch.cat(
            [torch.arange(min(sample // 2, self.n)), torch.randperm(self.n)[: sample // 2]]
        ).tolist()
        for i in picks:
            data, meta = ref.encode_page(self.pages[i], self.fmt)
            at = int(self.dst[i])
            if not (torch.equal(meta, self.meta[i]) and int(self.sizes[i]) == data.numel()):
                sys.exit(f"encode: page {i} metadata or size differs from the reference")
            if not torch.equal(self.heap[at : at + data.numel()], data):
                sys.exit(f"encode: page {i} stored bytes differ from the reference")

    def check_decode(self, what: str) -> None:
        if not torch.equal(self.out.view(torch.int16), self.pages.view(torch.int16)):
            sys.exit(f"decode ({what}): restored pages differ from the originals")
        self.out.view(torch.int16).fill_(0x7FBF)  # poison for the next check
