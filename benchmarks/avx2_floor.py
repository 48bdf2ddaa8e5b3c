"""The floor of a verify batch on an AVX2 CPU without VNNI: what one core's integer multiply-add
throughput allows for SmolLM2-135M (Q4_1 layers, Q8_0 output head), per token of a batch.

The repacked AVX2 tiles (cpu/x86/simd_avx2_packed.c) spend, per token and 8-row block of 32
weights (a "token-block", 256 multiply-adds): for Q4_0/Q4_1, 8 vpmaddubsw, 1 vpmaddwd (widening),
7 vpaddw, the float step (vcvtdq2ps, vmulps, 2 FMAs) and 10 broadcast loads; for Q8_0, 8 vpsignb,
8 vpmaddubsw, 8 vpmaddwd, 7 vpaddd and the float step. This script compiles dependency-free
loops of those instruction mixes (inline assembly, so the compiler cannot change them), times
them on one core (best of 9 runs of 10^7 iterations), and turns the cycles per token-block into
milliseconds per token of the model:

    python benchmarks/avx2_floor.py                  # needs cc and an AVX2 CPU
    python benchmarks/avx2_floor.py --t1-ms 4.8 --threads 2

With --t1-ms (a measured one-token forward, memory-bound) it prints the verify ratios these
floors allow at T = 8 and 16: max(T=1 time, T x compute per token / threads) / T=1 time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

Q4_TOKEN_BLOCKS = 30 * (576 * 576 * 2 + 576 * 192 * 2 + 576 * 1536 * 3) // 256  # 414720
Q8_TOKEN_BLOCKS = 49152 * 576 // 256  # 110592, the tied Q8_0 output head

SOURCE = r"""
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + 1e-9 * t.tv_nsec; }
static char buf[4096] __attribute__((aligned(64)));
#define M8 "vpmaddubsw %%ymm15,%%ymm14,%%ymm0\n vpmaddubsw %%ymm15,%%ymm14,%%ymm1\n" \
  "vpmaddubsw %%ymm15,%%ymm14,%%ymm2\n vpmaddubsw %%ymm15,%%ymm14,%%ymm3\n" \
  "vpmaddubsw %%ymm15,%%ymm14,%%ymm4\n vpmaddubsw %%ymm15,%%ymm14,%%ymm5\n" \
  "vpmaddubsw %%ymm15,%%ymm14,%%ymm6\n vpmaddubsw %%ymm15,%%ymm14,%%ymm7\n"
#define MA "vpmaddwd %%ymm15,%%ymm14,%%ymm12\n"
#define MA8 MA MA MA MA MA MA MA MA
#define SG8 "vpsignb %%ymm13,%%ymm12,%%ymm8\n vpsignb %%ymm13,%%ymm12,%%ymm9\n" \
  "vpsignb %%ymm13,%%ymm12,%%ymm10\n vpsignb %%ymm13,%%ymm12,%%ymm11\n" \
  "vpsignb %%ymm13,%%ymm12,%%ymm8\n vpsignb %%ymm13,%%ymm12,%%ymm9\n" \
  "vpsignb %%ymm13,%%ymm12,%%ymm10\n vpsignb %%ymm13,%%ymm12,%%ymm11\n"
#define SH "vpslld $16,%%ymm14,%%ymm12\n vpsrad $16,%%ymm12,%%ymm12\n" \
  "vpsrad $16,%%ymm14,%%ymm13\n vpaddd %%ymm12,%%ymm13,%%ymm13\n"
#define B8 "vpbroadcastd (%0),%%ymm8\n vpbroadcastd 4(%0),%%ymm9\n vpbroadcastd 8(%0),%%ymm10\n" \
  "vpbroadcastd 12(%0),%%ymm11\n vpbroadcastd 16(%0),%%ymm8\n vpbroadcastd 20(%0),%%ymm9\n" \
  "vpbroadcastd 24(%0),%%ymm10\n vpbroadcastd 28(%0),%%ymm11\n"
#define A7 "vpaddw %%ymm0,%%ymm1,%%ymm8\n vpaddw %%ymm2,%%ymm3,%%ymm9\n vpaddw %%ymm4,%%ymm5,%%ymm10\n" \
  "vpaddw %%ymm6,%%ymm7,%%ymm11\n vpaddw %%ymm8,%%ymm9,%%ymm12\n vpaddw %%ymm10,%%ymm11,%%ymm13\n" \
  "vpaddw %%ymm12,%%ymm13,%%ymm12\n"
#define EPI "vcvtdq2ps %%ymm14,%%ymm13\n vbroadcastss 32(%0),%%ymm8\n vbroadcastss 36(%0),%%ymm9\n" \
  "vmulps %%ymm15,%%ymm8,%%ymm10\n vfmadd231ps %%ymm15,%%ymm9,%%ymm11\n" \
  "vfmadd231ps %%ymm15,%%ymm10,%%ymm11\n"
#define RUN(NAME, BODY) { double best = 1e9; for (int r = 0; r < 9; r++) { double t0 = now(); \
  for (long i = 0; i < 10000000; i++) __asm__ volatile(BODY :: "r"(buf) : "xmm0", "xmm1", \
    "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
    "xmm13"); double dt = now() - t0; if (dt < best) best = dt; } \
  printf("%s %.4f\n", NAME, best / 1e7 * 1e9); }
int main(void) {
  RUN("maddubs8", M8)
  RUN("q4_madd", M8 MA B8 A7 EPI)
  RUN("q4_shift", M8 SH B8 A7 EPI)
  RUN("q8_madd", SG8 M8 MA8 B8 A7 EPI)
  return 0;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--t1-ms", type=float, help="a measured one-token forward, milliseconds")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="specdec-floor-") as d:
        src, exe = os.path.join(d, "floor.c"), os.path.join(d, "floor")
        with open(src, "w") as f:
            f.write(SOURCE)
        subprocess.run([a.cc, "-O2", "-o", exe, src], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    ns = {k: float(v) for k, v in (line.split() for line in out.splitlines())}
    ghz = 8.0 / ns["maddubs8"]  # vpmaddubsw: one per cycle on AMD's one pipe
    print(f"vpmaddubsw alone: 8 per {ns['maddubs8']:.3f} ns -> clock ~{ghz:.2f} GHz "
          f"if one per cycle (AMD); half that where two pipes take it (Intel since Skylake)")
    rows = [("Q4 token-block, madd widening", ns["q4_madd"]),
            ("Q4 token-block, shift widening", ns["q4_shift"]),
            ("Q8_0 token-block", ns["q8_madd"])]
    for name, t in rows:
        print(f"{name:34s} {t:.3f} ns = {t * ghz:.1f} cycles")
    for name, q4 in (("madd", ns["q4_madd"]), ("shift", ns["q4_shift"])):
        per_tok = (Q4_TOKEN_BLOCKS * q4 + Q8_TOKEN_BLOCKS * ns["q8_madd"]) * 1e-6
        line = (f"SmolLM2-135M Q4_1 ({name} widening): {per_tok:.2f} ms of multiply-adds per "
                f"token per core")
        if a.t1_ms:
            r = {T: max(a.t1_ms, T * per_tok / a.threads) / a.t1_ms for T in (8, 16)}
            line += (f"; with T=1 = {a.t1_ms} ms on {a.threads} thread(s): T=8 >= {r[8]:.2f}x, "
                     f"T=16 >= {r[16]:.2f}x")
        print(line)


if __name__ == "__main__":
    main()
