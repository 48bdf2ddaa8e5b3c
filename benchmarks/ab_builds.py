"""Two or more builds of specdec side by side on one machine: each is a directory holding a
built `specdec` package (for example a copy of the source tree's `specdec/` after
`python setup.py build_ext --inplace`, one per commit). Child processes alternate between the
builds, so all see the same machine state, and time one-forward calls (`bench_forward`, the
logits left in C) of SmolLM2-135M over T = 1, 8 and 16 tokens after a context, at 1 and 2
threads; medians over rounds.

    python benchmarks/ab_builds.py before/ after/ --rounds 5 --context 64

"-" names the installed specdec. Use it to decide whether a kernel or scheduling change pays
before committing it; the ratios, not the milliseconds, carry from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

CHILD = r"""
import json, sys
import numpy as np
import specdec
m = specdec.load(sys.argv[1])
context = int(sys.argv[2])
out = {}
for th in (1, 2):
    m.threads = th
    for T in (1, 8, 16):
        out[f"{th}-{T}"] = float(np.median([m._core.bench_forward(T, context, 10)
                                            for _ in range(7)]))
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", help="directories holding a built specdec ('-': installed)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=64)
    a = ap.parse_args()
    model = a.model
    if model is None:
        from specdec import hub

        model = hub.resolve(hub.DEFAULT_MODEL)
    res: dict = {b: [] for b in a.builds}
    for _ in range(a.rounds):
        for b in a.builds:
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECDEC_SIMD")}
            env.setdefault("OPENBLAS_NUM_THREADS", "1")
            if b != "-":
                env["PYTHONPATH"] = os.path.abspath(b)
            r = subprocess.run([sys.executable, "-c", CHILD, model, str(a.context)], env=env,
                               capture_output=True, text=True, check=True, cwd=os.sep)
            res[b].append(json.loads(r.stdout))
    print(f"context {a.context}, median of {a.rounds} rounds")
    print("| build | threads | T=1 ms | T=8 ms | T=8 / T=1 | T=16 / T=1 |")
    print("|---|---|---|---|---|---|")
    for b in a.builds:
        med = {k: float(np.median([o[k] for o in res[b]])) for k in res[b][0]}
        for th in (1, 2):
            t1, t8, t16 = (med[f"{th}-{T}"] for T in (1, 8, 16))
            print(f"| {b} | {th} | {1e3 * t1:.2f} | {1e3 * t8:.2f} | {t8 / t1:.2f}x | "
                  f"{t16 / t1:.2f}x |")


if __name__ == "__main__":
    main()
