"""bench/serving/import_probe.py lists every module an import needs and lacks, and only those."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.serving import import_probe


def _target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_every_missing_module_is_listed_not_only_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _target(
        tmp_path,
        monkeypatch,
        "probe_target",
        "import json\n"
        "import zz_absent_first\n"
        "from zz_absent_second.sub import Base\n"
        "class Child(Base):\n"
        "    pass\n"
        "VALUE = zz_absent_first.anything\n",
    )
    missing, error = import_probe.probe(module)
    assert missing == ["zz_absent_first", "zz_absent_second"] and error is None


def test_an_optional_import_the_package_catches_is_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """urllib3's `try: import brotlicffi` and Windows-only modules broke the first version: a stand-in for
    an optional module turned the package's fallback into an AttributeError."""
    module = _target(
        tmp_path,
        monkeypatch,
        "probe_optional",
        "try:\n"
        "    import zz_optional_codec as codec\n"
        "    ERRORS = (codec.CodecError,)\n"
        "except ImportError:\n"
        "    ERRORS = ()\n"
        "try:\n"
        "    import _winapi\n"
        "except ModuleNotFoundError:\n"
        "    pass\n"
        "import zz_required\n",
    )
    missing, error = import_probe.probe(module)
    assert missing == ["zz_required"] and error is None


def test_a_module_that_imports_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert import_probe.main(["json"]) == 0
    assert "json: imports" in capsys.readouterr().out


def test_its_own_errors_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _target(tmp_path, monkeypatch, "probe_broken", "raise ValueError('broken at import')\n")
    assert import_probe.main([module]) == 1
    missing, error = import_probe.probe(module)
    assert missing == [] and error is not None and "broken at import" in error
