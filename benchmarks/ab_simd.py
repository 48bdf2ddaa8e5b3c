"""Two kernel levels side by side on one machine: forwards of SmolLM2-135M over T = 1, 2, 4, 8,
16 tokens after a 64-token context, and a 512-token prefill, in child processes alternating
between this CPU's widest kernels and a capped level (SPECDEC_SIMD, read once per process), so
both see the same machine state. Reports the verify-cost ratios T / T=1 and prefill tok/s.

    OPENBLAS_NUM_THREADS=1 python benchmarks/ab_simd.py --cap avx512vnni --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

CHILD = r"""
import json, sys, time
import numpy as np
import specdec
from specdec import _core
m = specdec.load(sys.argv[1])
rng = np.random.default_rng(0)
ctx = [int(x) for x in rng.integers(100, 40000, 64)]
out = {}
for th in (1, 2):
    m.threads = th
    cache = m.new_cache(1024)
    m.forward(cache, ctx, n_logits=1)
    for T in (1, 2, 4, 8, 16):
        toks = [int(x) for x in rng.integers(100, 40000, T)]
        ts = []
        for r in range(7):
            t0 = time.perf_counter()
            for _ in range(4):
                cache.rollback(64)
                m.forward(cache, toks, n_logits=T)
            ts.append((time.perf_counter() - t0) / 4)
        out[f"{th}-{T}"] = float(np.median(ts))
    toks = [int(x) for x in rng.integers(100, 40000, 512)]
    ts = []
    for r in range(3):
        cache.rollback(0)
        t0 = time.perf_counter()
        m.forward(cache, toks, n_logits=1)
        ts.append(time.perf_counter() - t0)
    out[f"{th}-pre512"] = float(np.median(ts))
print(json.dumps([_core.simd_name(), out]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--cap", default="avx512vnni", help="SPECDEC_SIMD of the second arm")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    model = a.model
    if model is None:
        from specdec import hub

        model = hub.resolve(hub.DEFAULT_MODEL)
    arms = {"widest": None, a.cap: a.cap}
    res: dict = {k: [] for k in arms}
    names = {}
    for _ in range(a.rounds):
        for arm, cap in arms.items():
            env = {k: v for k, v in os.environ.items() if k != "SPECDEC_SIMD"}
            env.setdefault("OPENBLAS_NUM_THREADS", "1")
            if cap:
                env["SPECDEC_SIMD"] = cap
            r = subprocess.run([sys.executable, "-c", CHILD, model], env=env,
                               capture_output=True, text=True, check=True)
            names[arm], out = json.loads(r.stdout)
            res[arm].append(out)
    print("| kernels | threads | T=1 ms | T=2 | T=4 | T=8 | T=16 | prefill 512 tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in arms:
        med = {k: float(np.median([o[k] for o in res[arm]])) for k in res[arm][0]}
        for th in (1, 2):
            b = med[f"{th}-1"]
            cells = " | ".join(f"{med[f'{th}-{T}'] / b:.2f}x" for T in (2, 4, 8, 16))
            print(f"| {names[arm]} | {th} | {b * 1e3:.2f} | {cells} | "
                  f"{512 / med[f'{th}-pre512']:.0f} |")


if __name__ == "__main__":
    main()
