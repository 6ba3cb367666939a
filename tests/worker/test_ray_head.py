"""worker/ray_head.py: the GCS log tail, and the error a Ray head that never comes up ends in."""

from __future__ import annotations

from pathlib import Path

import pytest

from zipkv.worker import ray_head


def test_gcs_log_tail_reads_the_last_lines_of_both_logs(tmp_path: Path) -> None:
    (tmp_path / "gcs_server.err").write_text("\n".join(f"err {i}" for i in range(20)) + "\n")
    (tmp_path / "gcs_server.out").write_text("bind failed: address in use\n")
    tail = ray_head.gcs_log_tail(lines=2, logs_dir=tmp_path)
    assert tail == "gcs_server.err: err 18 | err 19; gcs_server.out: bind failed: address in use"
    assert ray_head.gcs_log_tail(logs_dir=tmp_path / "missing") == ""


def test_two_failed_starts_raise_with_the_gcs_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ray

    (tmp_path / "gcs_server.out").write_text("GCS started\nsegfault in rocksdb\n")
    monkeypatch.setattr(ray_head, "RAY_SESSION_LOGS", tmp_path)
    calls: list[dict[str, object]] = []

    def failing_init(**kwargs: object) -> None:
        calls.append(kwargs)
        raise TimeoutError("Timed out waiting for file gcs_server_port")

    monkeypatch.setattr(ray, "init", failing_init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)  # restored after the test
    said: list[str] = []
    with pytest.raises(RuntimeError, match=r"segfault in rocksdb.*ray stop"):
        ray_head.start_local_ray(2, {"A": "1"}, said.append, num_gpus=0)
    assert (
        len(calls) == 2 and calls[0]["num_gpus"] == 0 and calls[0]["runtime_env"] == {"env_vars": {"A": "1"}}
    )
    assert len(said) == 1 and "trying once more" in said[0] and "segfault in rocksdb" in said[0]
