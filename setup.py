"""Build specdec's extension module `specdec._core` from the C sources in csrc/ and its folders
(csrc/README.md: one folder per layer), plus cuda/*.cu when nvcc is available (set
SPECDEC_CPU_ONLY=1 to skip CUDA even then)."""

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
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


def parallel_compile(compiler, workers):
    """Make `compiler` (a distutils CCompiler) compile one extension's sources on `workers`
    threads: setuptools builds the sources of one extension one after another, and specdec is
    one extension of some sixty files."""
    def compile_all(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                    extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            if obj in build:
                src, ext = build[obj]
                compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, objects))
        return objects

    compiler.compile = compile_all


class BuildExt(build_ext):
    """Compile the .c sources side by side (-j N, else one per CPU) and the .cu sources with
    nvcc, and link them (with cudart and cuBLAS) into _core."""

    def build_extension(self, ext):
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        workers = self.parallel if isinstance(self.parallel, int) and self.parallel > 0 else (
            cpus or 1)
        parallel_compile(self.compiler, workers)
        cuda = find_cuda()
        if cuda is not None:
            nvcc = os.path.join(cuda, "bin", "nvcc")
            objdir = os.path.join(self.build_temp, "cuda")
            os.makedirs(objdir, exist_ok=True)
            jobs = []
            for src in sorted(glob(os.path.join("cuda", "*.cu"))):
                obj = os.path.join(objdir, os.path.basename(src) + ".o")
                jobs.append([nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-DSD_WITH_CUDA",
                             "-Icsrc", *cuda_arch_flags(), "-c", src, "-o", obj])
                ext.extra_objects.append(obj)
            for cmd in jobs:
                print(" ".join(cmd))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(subprocess.check_call, jobs))
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
