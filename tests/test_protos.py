"""The checked-in generated modules must match zipkv.proto (regenerate: `python -m zipkv.protos.generate`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor

from zipkv.protos import generate
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos.capacity import Capacity

PROTO_DIR = Path(generate.__file__).resolve().parent


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["zipkv_pb2.py", "zipkv_pb2.pyi", "zipkv_pb2_grpc.py"]
    stale = [n for n in names if (tmp_path / n).read_text() != (PROTO_DIR / n).read_text()]
    assert not stale, f"{stale} are stale: run `python -m zipkv.protos.generate` and commit the result"


def test_staleness_check_can_fail(tmp_path: Path) -> None:
    # A changed proto must produce different modules, otherwise the check above proves nothing.
    proto = (PROTO_DIR / generate.PROTO_FILE).read_text()
    changed = tmp_path / "src"
    changed.mkdir()
    (changed / generate.PROTO_FILE).write_text(
        proto.replace("bool draining = 16;", "bool draining = 16;\n  int32 x = 99;")
    )
    old_dir = generate.PROTO_DIR
    try:
        generate.PROTO_DIR = changed
        generate.generate(tmp_path / "out")
    finally:
        generate.PROTO_DIR = old_dir
    assert (tmp_path / "out" / "zipkv_pb2.py").read_text() != (PROTO_DIR / "zipkv_pb2.py").read_text()


def test_report_fields_the_router_relies_on() -> None:
    fields = set(pb.CapacityReport.DESCRIPTOR.fields_by_name)
    needed = {
        "worker_id",
        "address",
        "model",
        "sequence",
        "epoch",
        "timestamp_s",
        "headroom_tokens",
        "committed_tokens",
        "total_tokens",
        "compression_ratio",
        "running_requests",
        "queued_requests",
        "queued_prefill_tokens",
        "ttft_ms",
        "itl_ms",
        "draining",
        "max_context_tokens",
        "kv_bytes_per_token",
    }
    assert needed <= fields
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["Worker"].methods}
    assert methods == {"Generate", "Abort", "Health"}


def test_the_capacity_record_is_the_reports_fields() -> None:
    """Capacity (protos/capacity.py) goes on and off the wire by field name and type."""
    kinds = {
        pb.CapacityReport.DESCRIPTOR.fields_by_name[f.name].cpp_type for f in dataclasses.fields(Capacity)
    }
    assert kinds <= {
        FieldDescriptor.CPPTYPE_INT32,
        FieldDescriptor.CPPTYPE_INT64,
        FieldDescriptor.CPPTYPE_DOUBLE,
    }
    cap = Capacity(1, 2, 3, 0.75, 4, 5, 6, 7.5, 8.5, 9, 10)
    report = pb.CapacityReport(worker_id="w", **cap.report_fields())
    assert Capacity.from_report(pb.CapacityReport.FromString(report.SerializeToString())) == cap
