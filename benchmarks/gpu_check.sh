#!/usr/bin/env bash
# gpu_check.sh — everything the CUDA backend needs checked on a GPU, in one run of a few
# minutes, from a clean checkout and without network: build (nvcc, for the GPU's architecture),
# the CUDA tests (every kernel against its CPU twin, CPU == CUDA, speculative loops on the
# device), then the measurements of benchmarks/gpu_bench.py. A short table is printed last;
# logs and details go to $OUT (or ./gpu_check_out).
#
#     bash benchmarks/gpu_check.sh            # SPECDEC_CUDA_ARCH=90 (H100/H200) by default
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_check_out}"
mkdir -p "$out"
export SPECDEC_CUDA_ARCH="${SPECDEC_CUDA_ARCH:-90}"
export PYTHONUNBUFFERED=1
t0=$SECONDS

echo "== build: $(nvcc --version | tail -1), arch $SPECDEC_CUDA_ARCH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ! python3 -m pip install --no-build-isolation --no-deps --no-cache-dir -q . \
        >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    echo "BUILD FAILED"
    exit 1
fi
python3 -c "from specdec import _core as c; print('built with CUDA:', c.built_with_cuda(), c.cuda_probe())"

echo "== CUDA tests ($((SECONDS - t0)) s)"
timeout 240 python3 -m pytest -q -p no:cacheprovider --maxfail=25 -rs \
    tests/test_cuda.py tests/test_twins.py tests/test_dummy.py >"$out/tests.log" 2>&1
echo "pytest exit status $?"
grep -E "^(FAILED|ERROR)|passed|failed|error" "$out/tests.log" | tail -30

echo "== measurements ($((SECONDS - t0)) s)"
timeout 330 python3 benchmarks/gpu_bench.py --out "$out/gpu_bench.json" >"$out/bench.log" 2>&1
echo "gpu_bench exit status $?"
tail -32 "$out/bench.log"
echo "== done in $((SECONDS - t0)) s"
