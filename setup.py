"""Build specdec's extension module `specdec._core` from the C sources in csrc/ and its folders
(csrc/README.md: one folder per layer), plus cuda/*.cu when nvcc is available (set
SPECDEC_CPU_ONLY=1 to skip CUDA even then)."""

import os
import shutil
import subprocess
import sys
from glob import glob

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

C_FLAGS = [
    "-std=c99",
    "-O3",
    "-Wall",
    "-Wextra",
    "-Wshadow",
    "-fno-strict-aliasing",
    "-pthread",
    "-D_GNU_SOURCE",
]


def find_cuda():
    """Return the CUDA toolkit root if nvcc is usable and CUDA is not disabled, else None."""
    if os.environ.get("SPECDEC_CPU_ONLY", "") not in ("", "0"):
        return None
    nvcc = shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if nvcc is None and home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        nvcc = os.path.join(home, "bin", "nvcc")
    if nvcc is None:
        return None
    return home or os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def cuda_arch_flags():
    """nvcc -gencode flags: machine code for each architecture in SPECDEC_CUDA_ARCH (default
    "80;90": A100, H100/H200), plus PTX of the last for newer GPUs to compile at load."""
    archs = [a.strip() for a in os.environ.get("SPECDEC_CUDA_ARCH", "80;90").split(";")
             if a.strip()]
    flags = []
    for a in archs:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    if archs:
        flags += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
    return flags


class BuildExt(build_ext):
    """Compile the .cu sources with nvcc and link them (with cudart and cuBLAS) into _core."""

    def build_extension(self, ext):
        cuda = find_cuda()
        if cuda is not None:
            nvcc = os.path.join(cuda, "bin", "nvcc")
            objdir = os.path.join(self.build_temp, "cuda")
            os.makedirs(objdir, exist_ok=True)
            for src in sorted(glob(os.path.join("cuda", "*.cu"))):
                obj = os.path.join(objdir, os.path.basename(src) + ".o")
                cmd = [nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-DSD_WITH_CUDA",
                       "-Icsrc", *cuda_arch_flags(), "-c", src, "-o", obj]
                print(" ".join(cmd))
                subprocess.check_call(cmd)
                ext.extra_objects.append(obj)
            libdir = next((d for d in (os.path.join(cuda, "lib64"), os.path.join(cuda, "lib"))
                           if os.path.isdir(d)), os.path.join(cuda, "lib64"))
            ext.define_macros.append(("SD_WITH_CUDA", "1"))
            ext.library_dirs.append(libdir)
            ext.runtime_library_dirs.append(libdir)
            ext.libraries.extend(["cudart", "cublas", "stdc++"])
            ext.include_dirs.append(os.path.join(cuda, "include"))
            print(f"specdec: building with CUDA from {cuda}")
        else:
            print("specdec: building for CPU only (no nvcc found, or SPECDEC_CPU_ONLY set)")
        super().build_extension(ext)


core = Extension(
    "specdec._core",
    sources=sorted(glob(os.path.join("csrc", "**", "*.c"), recursive=True)),
    # a changed header rebuilds the extension (the sources alone are checked otherwise)
    depends=sorted(glob(os.path.join("csrc", "**", "*.h"), recursive=True)),
    include_dirs=["csrc", numpy.get_include()],
    extra_compile_args=C_FLAGS,
    extra_link_args=["-pthread"],
    libraries=["m"],
)

setup(ext_modules=[core], cmdclass={"build_ext": BuildExt})
