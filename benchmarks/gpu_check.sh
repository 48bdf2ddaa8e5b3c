#!/usr/bin/env bash
# gpu_check.sh — everything the CUDA backend needs checked on a GPU, in one run of a few
# minutes, from a clean checkout and without network: build (nvcc, for the GPU's architecture),
# the CUDA tests (every kernel against its CPU twin, CPU == CUDA, speculative loops on the
# device), then the measurements of benchmarks/gpu_bench.py. A short table is printed last;
# logs and details go to $OUT (or ./gpu_check_out).
#
#     bash benchmarks/gpu_check.sh            # SPECDEC_CUDA_ARCH=90 (H100/H200) by default
#
# GPU_CHECK_TEST_S and GPU_CHECK_BENCH_S (seconds; 240 and 330 by default) bound the tests and
# the measurements; GPU_BENCH_PART_TIMEOUT bounds each measurement's part.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_check_out}"
mkdir -p "$out"
export SPECDEC_CUDA_ARCH="${SPECDEC_CUDA_ARCH:-90}"
export PYTHONUNBUFFERED=1
export SPECDEC_REQUIRE="${SPECDEC_REQUIRE:-cuda}"  # a skipped CUDA test fails here
t0=$SECONDS

echo "== build: $(nvcc --version | tail -1), arch $SPECDEC_CUDA_ARCH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# in place and in parallel (nvcc's sources too): the tests import specdec from this checkout
if ! python3 setup.py build_ext --inplace -j "$(nproc)" >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    echo "BUILD FAILED"
    exit 1
fi
echo "built in $((SECONDS - t0)) s"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "from specdec import _core as c; print('built with CUDA:', c.built_with_cuda(), c.cuda_probe())"

echo "== CUDA tests ($((SECONDS - t0)) s)"
# one stuck test must not take the whole run (pytest-timeout, where it is installed)
per_test=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout=${GPU_CHECK_PER_TEST_S:-60}")
timeout "${GPU_CHECK_TEST_S:-240}" python3 -m pytest -q -p no:cacheprovider --maxfail=25 -rs \
    --durations=12 ${per_test:-} \
    tests/test_cuda.py tests/test_twins.py tests/test_dummy.py >"$out/tests.log" 2>&1
echo "pytest exit status $?"
grep -E "^(FAILED|ERROR)|passed|failed|error|^[0-9.]+s (call|setup)" "$out/tests.log" | tail -40

# the default stages the matmuls' activations in shared memory for quantized rows and for float
# rows from 2 tokens; the tests again with it never (=0), then always (=1)
for stage in 0 1; do
    echo "== the same matmul, model and loop tests with SPECDEC_CUDA_STAGE=$stage ($((SECONDS - t0)) s)"
    SPECDEC_CUDA_STAGE=$stage timeout "${GPU_CHECK_TEST_S:-240}" python3 -m pytest -q -p no:cacheprovider \
        --maxfail=25 -rs ${per_test:-} tests/test_cuda.py -k "matmul or bitwise or forward or greedy \
        or quantized or trees or cache_check or sampled" >"$out/tests_stage$stage.log" 2>&1
    echo "pytest exit status $?"
    grep -E "^(FAILED|ERROR)|passed|failed|error" "$out/tests_stage$stage.log" | tail -30
done

echo "== measurements ($((SECONDS - t0)) s)"
timeout "${GPU_CHECK_BENCH_S:-330}" python3 benchmarks/gpu_bench.py --out "$out/gpu_bench.json" \
    >"$out/bench.log" 2>&1
echo "gpu_bench exit status $?"
tail -32 "$out/bench.log"
echo "== done in $((SECONDS - t0)) s"
