"""stack/ray_head.py: the GCS log tail, and the error a Ray head that never comes up ends in."""

from __future__ import annotations

from pathlib import Path

import pytest

from zipkv.stack import ray_head


def test_gcs_log_tail_reads_the_last_lines_of_both_logs(tmp_path: Path) -> None:
    (tmp_path / "gcs_server.err").write_text("\n".join(f"err {i}" for i in range(20)) + "\n")
    (tmp_path / "gcs_server.out").write_text("bind failed: address in use\n")
    tail = ray_head.gcs_log_tail(lines=2, logs_dir=tmp_path)
    assert tail == "gcs_server.err: err 18 | err 19; gcs_server.out: bind failed: address in use"
    assert ray_head.gcs_log_tail(logs_dir=tmp_path / "missing") == ""


def fake_ray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failures: int) -> list[dict[str, object]]:
    """`ray.init` failing its first `failures` calls as a slow GCS does; the GCS log in `tmp_path`."""
    import ray

    (tmp_path / "gcs_server.out").write_text("GCS started\nsegfault in rocksdb\n")
    monkeypatch.setattr(ray_head, "RAY_SESSION_LOGS", tmp_path)
    calls: list[dict[str, object]] = []

    def init(**kwargs: object) -> None:
        calls.append(kwargs)
        if len(calls) <= failures:
            raise TimeoutError("Timed out waiting for file gcs_server_port")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)  # restored after the test
    return calls


def test_every_failed_start_raises_with_the_gcs_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = fake_ray(monkeypatch, tmp_path, failures=99)
    said: list[str] = []
    with pytest.raises(RuntimeError, match=r"segfault in rocksdb.*ray stop"):
        ray_head.start_local_ray(2, {"A": "1"}, said.append, num_gpus=0)
    assert len(calls) == 3 and calls[0]["num_gpus"] == 0
    assert calls[0]["runtime_env"] == {"env_vars": {"A": "1"}}
    assert len(said) == 2 and said[-1].endswith("try 3 of 3")
    assert all("segfault in rocksdb" in line for line in said)


def test_a_start_that_fails_once_is_tried_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = fake_ray(monkeypatch, tmp_path, failures=1)
    said: list[str] = []
    ray_head.start_local_ray(2, {}, said.append)
    assert len(calls) == 2 and len(said) == 1 and said[0].endswith("try 2 of 3")
