"""The docs' pictures render from the committed JSON by one command, and the kernel plot keeps up with
results it has not seen: a new implementation name or a new variant field gets its own line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.patches import Rectangle

from bench.plots import admission_figure, decode_figure, decode_series, render_all

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def test_one_command_renders_every_picture_from_the_committed_results(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.plots", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    names = {p.name for p in tmp_path.glob("*.png")}
    decode = {f"{p.stem}.png" for p in (REPO / "bench" / "results").glob("decode_attention*.json")}
    assert names == decode | {
        "sglang_e2e.png",
        "admission.png",
        "trace_timeline.png",
        "decode_hopper.png",
        "decode_hopper_h100.png",
        "decode_hopper_h100_skewed.png",
        "decode_hopper_split_cap_h200.png",
        "decode_hopper_even_shares_h200.png",
        "decode_hopper_timeline.png",
        "decode_hopper_even_shares_timeline_h100.png",
        "decode_hopper_prologue_merge_timeline_h100.png",
        "sglang_e2e_lean_cap_whole.png",
        "sglang_e2e_step_profile_59_h100.png",
    }
    for path in tmp_path.glob("*.png"):
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 20_000, path
    # The docs link the committed pictures this command writes.
    for name in (
        "decode_attention.png",
        "sglang_e2e.png",
        "admission.png",
        "trace_timeline.png",
        "decode_hopper.png",
        "decode_hopper_h100.png",
        "decode_hopper_h100_skewed.png",
        "decode_hopper_split_cap_h200.png",
        "decode_hopper_even_shares_h200.png",
        "decode_hopper_timeline.png",
        "decode_hopper_even_shares_timeline_h100.png",
        "decode_hopper_prologue_merge_timeline_h100.png",
        "sglang_e2e_lean_cap_whole.png",
    ):
        assert (REPO / "docs" / "img" / name).is_file(), name


def row(impl: str, batch: int, context: int, us: float, **extra: object) -> dict[str, object]:
    return {"batch": batch, "context": context, "impl": impl, "median_us": us, **extra}


def test_new_implementations_and_variants_get_their_own_lines() -> None:
    rows = [
        row("flashinfer_tc", 32, 4096, 140.0, compressible_fraction=None),
        row("flashinfer_tc", 32, 8192, 257.0, compressible_fraction=None),
        row("zipkv", 32, 4096, 148.0, compressible_fraction=0.9425),
        row("zipkv", 32, 4096, 160.0, compressible_fraction=0.0),  # an extreme: not the realistic line
        row("zipkv", 32, 8192, 271.0, compressible_fraction=0.9426),
        row("zipkv", 32, 8192, 230.0, compressible_fraction=0.9425, kernel="v3"),  # a new variant field
        row("zipkv_paired", 32, 8192, 240.0, compressible_fraction=0.9424),  # a new implementation
        row("mystery_impl", 32, 8192, 300.0),  # no fraction at all
    ]
    series = decode_series(rows)
    assert series["zipkv (~94% compressible)"] == {32: {4096: 148.0, 8192: 271.0}}
    assert series["zipkv kernel=v3 (~94% compressible)"] == {32: {8192: 230.0}}
    assert series["zipkv_paired (~94% compressible)"] == {32: {8192: 240.0}}
    assert series["mystery_impl"] == {32: {8192: 300.0}}
    fig = decode_figure({"rows": rows, "device": "test"}, "synthetic")
    labels = set(fig.legends[0].get_texts()[i].get_text() for i in range(len(fig.legends[0].get_texts())))
    assert {
        "zipkv kernel=v3 (~94% compressible)",
        "zipkv_paired (~94% compressible)",
        "mystery_impl",
    } <= labels
    speed = fig.axes[len(fig.axes) // 2].get_lines()  # the speed-vs-FlashInfer panel
    assert any(abs(line.get_ydata()[-1] - 257.0 / 230.0) < 1e-9 for line in speed)


def test_a_results_folder_with_new_files_renders_them_too(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    new = {"device": "GPU", "rows": [row("zipkv", 8, 1024, 20.0, compressible_fraction=0.94)]}
    (results / "decode_attention_next.json").write_text(json.dumps(new))
    written = render_all(tmp_path / "img", results)
    assert [p.name for p in written] == ["decode_attention_next.png"]


@pytest.mark.parametrize(
    "name", ["decode_attention.png", "sglang_e2e.png", "admission.png", "trace_timeline.png"]
)
def test_benchmarks_and_observability_docs_link_the_pictures(name: str) -> None:
    docs = (REPO / "docs" / "benchmarks.md").read_text() + (REPO / "docs" / "observability.md").read_text()
    assert f"img/{name}" in docs


def test_admission_plot_reads_files_with_and_without_page_format_versions() -> None:
    old = [{"layer_fractions": "uniform", "compression": c, "shared_pool": p, "max_concurrent_requests": n}
           for c, p, n in ((False, False, 46), (True, False, 57), (True, True, 57))]  # fmt: skip
    new = [{**r, "format_version": v} for v in (2, 3) for r in old]
    for rows, bars in ((old, 2), (new, 4)):
        ax = admission_figure({"rows": rows}, None).axes[0]
        labels = ax.get_legend_handles_labels()[1]
        assert "uncompressed: 46" in labels and len(labels) == bars + 1, labels


def test_the_hopper_picture_shows_each_shapes_speed_against_flashinfer() -> None:
    from bench.kernels.plot_hopper import speed_rows

    rows = [
        {"batch": 32, "ctx": 8192, "zipkv_us": 250.0, "zipkv_raw_pages_us": 256.0,
         "read_floor_stored_us": 193.0, "flashinfer_tc_us": 257.0},
        {"batch": 1, "ctx": 8192, "zipkv_us": 32.0, "flashinfer_tc_us": 25.0},  # a row without every series
        {"batch": 8, "ctx": 8192, "zipkv_us": 80.0},  # no baseline: not drawn
    ]  # fmt: skip
    got = dict(speed_rows(rows))
    assert set(got) == {"32 x 8192", "1 x 8192"}
    assert got["32 x 8192"]["zipkv Hopper kernel, v3 pages"] == pytest.approx(257.0 / 250.0)
    assert got["1 x 8192"] == {"zipkv Hopper kernel, v3 pages": pytest.approx(25.0 / 32.0)}


def test_a_speed_past_the_cap_is_drawn_to_it_and_labelled_with_its_value() -> None:
    """One anomalous baseline (FlashInfer at 626 us, its floor 58) must not flatten every other bar."""
    from bench.kernels.plot_hopper import SPEED_CAP, hopper_figure

    rows = [
        {"batch": 32, "ctx": 8192, "zipkv_us": 250.0, "flashinfer_tc_us": 300.0},
        {"batch": 1, "ctx": 32768, "zipkv_us": 59.0, "flashinfer_tc_us": 626.0},
    ]
    ax = hopper_figure({"rows": rows}).axes[0]
    heights = sorted(round(p.get_height(), 3) for p in ax.patches if p.get_height() > 0)
    assert heights == [1.2, SPEED_CAP]
    assert [t.get_text() for t in ax.texts] == [f"{626.0 / 59.0:.1f}x"]


def test_the_step_profile_picture_stacks_each_runs_groups_whole_and_per_running_request() -> None:
    from bench.serving.plot_step_profile import GROUP_COLORS, step_profile_figure
    from bench.serving.step_profile import KERNEL_GROUPS

    # a group step_profile.py can report but the picture has no colour for would be left out of the bars
    assert {g for g, _ in KERNEL_GROUPS} | {"other"} <= set(GROUP_COLORS)

    def row(system: str, running: int, groups: dict[str, float]) -> dict[str, object]:
        return {"system": system, "rc": 0, "max_running_requests": running, "decode_step_ms": 10.0,
                "step_profile": {"groups_ms_per_step": groups}}  # fmt: skip

    rows = [row("zipkv", 4, {"attention_zipkv": 6.0, "gemm": 2.0}),
            {"system": "unprofiled", "rc": 0, "max_running_requests": 1, "decode_step_ms": 1.0},
            row("flashinfer", 2, {"attention_flashinfer": 5.0, "gemm": 2.0, "other": 1.0})]  # fmt: skip
    whole, per_request = step_profile_figure({"rows": rows}).axes[:2]
    for ax, scale in ((whole, (1, 1)), (per_request, (4, 2))):
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == ["zipkv\n4 running", "flashinfer\n2 running"]  # the run without a profile: no bar
        ends: dict[float, float] = {}
        for bar in ax.patches:
            assert isinstance(bar, Rectangle)
            y = round(bar.get_y() + bar.get_height() / 2)
            ends[y] = max(ends.get(y, 0.0), bar.get_x() + bar.get_width())
        assert ends[0] == pytest.approx(8.0 / scale[0]) and ends[1] == pytest.approx(8.0 / scale[1])
    assert [t.get_text() for t in whole.figure.legends[0].get_texts()] == [
        "attention_zipkv", "attention_flashinfer", "gemm", "other"]  # fmt: skip
