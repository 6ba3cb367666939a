"""bench/serving/import_probe.py lists every missing module of an import in one run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.serving import import_probe


def test_every_missing_module_is_listed_not_only_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "probe_target.py").write_text(
        "import json\n"
        "import zz_absent_first\n"
        "from zz_absent_second.sub import Base\n"
        "class Child(Base):\n"
        "    pass\n"
        "VALUE = zz_absent_first.anything\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # the stand-ins do not outlive the test
    missing, error = import_probe.probe("probe_target")
    assert missing == ["zz_absent_first", "zz_absent_second"] and error is None


def test_a_module_that_imports_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert import_probe.main(["json"]) == 0
    assert "json: imports" in capsys.readouterr().out


def test_its_own_errors_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "probe_broken.py").write_text("raise ValueError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    assert import_probe.main(["probe_broken"]) == 1
    missing, error = import_probe.probe("probe_broken")
    assert missing == [] and error is not None and "broken at import" in error
