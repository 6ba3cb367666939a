"""The format study (kernels/study*.py): its block rules against the real formats, its RoPE variants, a run.

Fast: a tiny random-weight Llama stands in for SmolLM2 where the capture machinery is checked (the real
study loads SmolLM2 for about a minute), MiniLM runs on one chunk of the corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zipkv.kernels.study import blocks as sb
from zipkv.kernels.study.cli import main, study_capture
from zipkv.kernels.study.models import capture_decoder, sglang_rope


def _bits_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(torch.bfloat16)


def _stream(tokens: int, heads: int, head_dim: int, seed: int) -> torch.Tensor:
    """Normal values with a few tiny ones and zeros: some blocks of every geometry go raw."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, heads, head_dim, generator=gen) * 0.05
    x[torch.rand(x.shape, generator=gen) < 0.0003] = 0.0
    x[torch.rand(x.shape, generator=gen) < 0.0003] = 1e-9
    return x.bfloat16()


@pytest.mark.parametrize("head_dim", [64, 128])
def test_candidate_rules_count_the_blocks_the_real_formats_code(head_dim: int) -> None:
    k, v = _stream(160, 3, head_dim, 1), _stream(160, 3, head_dim, 2)
    by_name = {c.geometry: c for c in sb.measure_candidates(k)}
    by_name_v = {c.geometry: c for c in sb.measure_candidates(v)}
    for version, geometry in ((2, f"{512 // head_dim}x{head_dim}"), (3, "16x4p")):
        pages = sb.measure_format(k, v, version)
        assert pages.pages_stored_raw == 0
        assert pages.coded_blocks == (by_name[geometry].coded_blocks, by_name_v[geometry].coded_blocks)
        assert 0 < pages.coded_blocks[0] < pages.blocks[0]


def test_every_candidate_tiles_the_page_head_once() -> None:
    exps = torch.arange(16 * 64, dtype=torch.int32).view(1, 16, 64)
    for cand in sb.candidates(64):
        blocks = cand.blocks(exps)
        assert blocks.shape == (1, 1024 // cand.values, cand.values)
        assert torch.equal(blocks.flatten().sort().values, exps.flatten()), cand.name
    pairs = {c.name: c for c in sb.candidates(64)}["16x4p"].blocks(exps)[0, 1]
    assert sorted(int(x) % 64 for x in pairs[:8]) == [4, 5, 6, 7, 36, 37, 38, 39]  # pairs (p, p + 32)


def test_the_exact_zero_code_keeps_a_14_wide_window() -> None:
    def block(exponents: list[int]) -> tuple[bool, bool]:
        plain, zero = sb.coded_blocks(torch.tensor([exponents + [exponents[-1]] * (64 - len(exponents))]))
        return bool(plain[0]), bool(zero[0])

    assert block([120, 135]) == (True, True)  # span 16 from an even base, no zero
    assert block([120, 136]) == (False, False)
    assert block([0, 120, 133]) == (False, True)  # a zero and 14 exponents above an even base
    assert block([0, 120, 134]) == (False, False)
    assert block([0, 121, 134]) == (False, False)  # the base rounds down to 120: 134 is 14 above it
    assert block([0, 3, 15]) == (True, True)  # fits the plain window with the zero in it
    assert block([0, 0]) == (True, True)


def test_candidate_bytes_count_one_metadata_byte_per_block() -> None:
    assert sb.candidate_bytes_per_value(3, 4, 128) == (3 * 192 + 256 + 4) / 512


def test_sglang_rope_rounds_once_and_bf16_rope_does_not() -> None:
    k = torch.randn(512, 2, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    d, t = 64, torch.arange(512, dtype=torch.float64)
    inv = 1.0 / (100000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    f = (t[:, None] * inv)[:, None, :]
    x, y = k[..., :32].double(), k[..., 32:].double()
    exact = torch.cat([x * f.cos() - y * f.sin(), x * f.sin() + y * f.cos()], dim=-1).bfloat16()
    ours = sglang_rope(k, 100000.0)
    cos, sin = f.float().cos().bfloat16(), f.float().sin().bfloat16()
    kx, ky = k[..., :32], k[..., 32:]
    in_bf16 = torch.cat([kx * cos - ky * sin, ky * cos + kx * sin], dim=-1)
    assert (ours == exact).double().mean() > 0.995  # fp32 rounding only moves near-ties
    assert (in_bf16 == exact).double().mean() < 0.9


def _tiny_llama() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=256, hidden_size=192, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=64, rope_theta=100000.0,
                         max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def test_decoder_capture_holds_k_before_and_after_rope_both_ways() -> None:
    capture = capture_decoder(_tiny_llama(), list(range(40, 232)), "tiny")
    k = capture.streams[(1, "K_prerope")]
    assert k.shape == (192, 2, 64) and capture.streams[(1, "V")].shape == (192, 2, 64)
    # transformers: cos/sin rounded to bf16, every product and sum in bf16
    emb = torch.arange(192, dtype=torch.float32)[:, None] * (1 / 100000.0 ** (torch.arange(0, 64, 2) / 64))
    emb = torch.cat([emb, emb], dim=-1)[:, None, :]
    rotated = torch.cat([-k[..., 32:], k[..., :32]], dim=-1)
    expect = k * emb.cos().bfloat16() + rotated * emb.sin().bfloat16()
    assert torch.equal(capture.streams[(1, "K_bf16")], expect)
    assert torch.equal(capture.streams[(1, "K")], sglang_rope(k, 100000.0))
    assert not torch.equal(capture.streams[(1, "K")], capture.streams[(1, "K_bf16")])

    study = study_capture(capture, 0.0)
    v3 = [r.counts for r in study.formats if r.version == 3 and r.k_stream == "K"]
    assert len(v3) == 2 and all(c.pages == 12 for c in v3)
    for c in v3:  # exact v3 sizes: records, 64 B per raw block of a coded page, raw pages at raw size
        raw_blocks = sum(c.blocks) - sum(c.coded_blocks)
        assert c.pages_stored_raw == 0
        assert sum(c.stored_bytes) == 12 * 4 * 24 * 64 + 64 * raw_blocks
        assert c.meta_bytes == 12 * 4 * 8
    assert {r.stream for r in study.geometries} == {"K", "K_bf16", "K_prerope", "V"}


def test_study_runs_on_minilm(tmp_path: Path) -> None:
    out = tmp_path / "study.json"
    assert main(["--models", "minilm", "--minilm-chunks", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    geometries = {(s["stream"], s["geometry"]) for s in result["summary"]["geometries"]}
    assert {"4x128", "16x32", "16x16p", "16x4p", "1x64", "16x4"} <= {g for _, g in geometries}
    assert {s for s, _ in geometries} == {"K", "V"}
    for s in result["summary"]["geometries"]:
        # trained-model KV codes well but not perfectly; exactly 1.0 would mean nothing was checked
        assert 0.5 < s["coded_fraction"] <= s["coded_fraction_zero_code"] < 1.0
        assert 1.5 < s["bytes_per_value"] < 2.0
    formats = {(f["version"], f["k_stream"]): f for f in result["summary"]["formats"]}
    assert set(formats) == {(2, "K"), (3, "K")}
    assert all(0.74 < f["stored_over_raw"] < 1.0 for f in formats.values())
    assert len(result["rows"]) == 6 * 2 * 12  # layers x K/V x geometries
