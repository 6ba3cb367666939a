"""A step's encoded pages packed one after another per region, from their stage places (PagePool's encode).

Two ways, the same bytes in the same places (tests/allocator/test_pack.py):
- "torch" (the default on the CPU): a slice of staged pages gathered whole into a temporary copy, then every
  unit scattered back, the kept ones to their packed places and the dropped ones to the pool's scratch unit
  (static shapes, no host sync);
- "triton" (the default on CUDA, kernels/codec/pack.py): copies the kept units only, through a temporary
  buffer of its own. On an H100 a 512-page, 32-layer encode launch took 2.36 ms with it against 13.3 ms with
  the torch way (``python -m bench.allocator.encode_launch``, bench/results/encode_launch_h100.json); on the
  CPU the kernel runs only under Triton's interpreter.
``pack_choice`` picks one when a pool is made: ``$ZIPKV_POOL_PACK``, else the faster for the device.
Slices go in ascending order: a page's packed place never reaches past a later page's stage place, so a slice
never overwrites what a later one still has to read.
"""

from __future__ import annotations

import torch

from zipkv.kernels.env_choice import env_choice

POOL_PACK_ENV = "ZIPKV_POOL_PACK"
POOL_PACKS = ("torch", "triton")
POOL_PACK_DEFAULTS = {"cuda": "triton", "cpu": "torch"}  # by device type; other devices: torch


def pack_choice(device_type: str) -> str:
    """``$ZIPKV_POOL_PACK``: "torch" or "triton"; unset, the measured faster way for ``device_type``
    (POOL_PACK_DEFAULTS); anything else fails when the pool is made."""
    return env_choice(POOL_PACK_ENV, POOL_PACKS, POOL_PACK_DEFAULTS.get(device_type, "torch"))


class Packer:
    """Packs slices of at most ``slice_pages`` pages of ``units`` (int64 [N, W]: the pool's heap in units of
    8-byte words), whose raw pages are ``raw_page_units`` units."""

    def __init__(self, units: torch.Tensor, raw_page_units: int, slice_pages: int, scratch_unit: int) -> None:
        self.units, self.raw_page_units = units, raw_page_units
        self.slice_pages, self.scratch_unit = slice_pages, scratch_unit
        self._j = torch.arange(raw_page_units, device=units.device)
        self._temp: torch.Tensor | None = None  # the kernel's: int64 [slice_pages * raw_page_units, W]

    def pack(self, stage: torch.Tensor, dst: torch.Tensor, size_units: torch.Tensor, impl: str) -> None:
        """Units [0, size_units[i]) of page i from unit ``stage[i]`` to unit ``dst[i]`` (int64 [n] each)."""
        for lo in range(0, stage.numel(), self.slice_pages):
            hi = min(stage.numel(), lo + self.slice_pages)
            if impl == "triton":
                self._pack_triton(stage[lo:hi], dst[lo:hi], size_units[lo:hi])
            elif impl == "torch":
                self._pack_torch(stage[lo:hi], dst[lo:hi], size_units[lo:hi])
            else:
                raise ValueError(f"pack impl {impl!r}: expected 'torch' or 'triton'")

    def _pack_torch(self, stage: torch.Tensor, dst: torch.Tensor, size_units: torch.Tensor) -> None:
        j = self._j
        temp = self.units[stage[:, None] + j]
        keep = j < size_units[:, None]
        self.units[torch.where(keep, dst[:, None] + j, self.scratch_unit)] = temp

    def _pack_triton(self, stage: torch.Tensor, dst: torch.Tensor, size_units: torch.Tensor) -> None:
        from zipkv.kernels.codec.pack import pack_units

        if self._temp is None:
            rows = self.slice_pages * self.raw_page_units
            self._temp = self.units.new_empty(rows, self.units.shape[1])
        pack_units(self.units, self._temp, stage, dst, size_units, self.raw_page_units)
