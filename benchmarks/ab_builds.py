"""Two or more builds of specdec side by side on one machine: each is a directory holding a
built `specdec` package (for example a copy of the source tree's `specdec/` after
`python setup.py build_ext --inplace`, one per commit). Child processes alternate between the
builds, so all see the same machine state, and time one-forward calls (`bench_forward`, the
logits left in C) of SmolLM2-135M over T tokens (default 1, 8 and 16) after a context, at 1
and 2 threads, and optionally prefills and (--attention) the CPU attention of those forwards
alone (`_core.bench_attention`: all layers, the model's heads, an f16 cache; builds without it
are left out of that table); medians over rounds.

    python benchmarks/ab_builds.py before/ after/ --rounds 5 --context 64
    python benchmarks/ab_builds.py before/ after/ --context 2000 --tokens 1,2,4,8 --reps 1 \
        --iters 20 --prefill 512,1500
    python benchmarks/ab_builds.py before/ after/ --context 1500 --attention --rounds 8
    python benchmarks/ab_builds.py before/ after/ --simd avx2 --model "$SPECDEC_GEMMA3_GGUF"

"-" names the installed specdec. BUILD@LEVEL runs that build with SPECDEC_SIMD=LEVEL (overriding
--simd), so one build's kernel levels alternate like builds:

    python benchmarks/ab_builds.py build/@avx2 build/@avxvnni build/ --tokens 1,2,4,8,16
 Use it to decide whether a kernel or scheduling change pays
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
from specdec import _core
m = specdec.load(sys.argv[1])
context, reps, iters = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tokens = [int(t) for t in sys.argv[5].split(",")]
prefill = [int(t) for t in sys.argv[6].split(",") if t]
attention = sys.argv[7] == "1" and hasattr(_core, "bench_attention")
out = {}
c = m.config
for th in (1, 2) if attention else ():
    for T in tokens:  # the slots a forward over T tokens after the context attends to
        out[f"att-{th}-{T}"] = float(np.median([
            _core.bench_attention(T, context + T, c.n_heads, c.n_kv_heads, c.head_dim,
                                    c.n_layers, th, iters) for _ in range(reps)]))
for th in (1, 2):
    m.threads = th
    for T in tokens:
        out[f"{th}-{T}"] = float(np.median([m._core.bench_forward(T, context, iters)
                                            for _ in range(reps)]))
m.threads = 2
for P in prefill:  # one forward over P tokens from an empty cache, best of three
    m._core.bench_forward(P, 0, 1)
    out[f"prefill-{P}"] = min(m._core.bench_forward(P, 0, 1) for _ in range(3))
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", help="directories holding a built specdec ('-': installed)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--tokens", default="1,8,16", help="batch sizes T, comma-separated")
    ap.add_argument("--reps", type=int, default=7, help="timings per T and round (median)")
    ap.add_argument("--iters", type=int, default=10, help="forwards per timing")
    ap.add_argument("--prefill", default="",
                    help="prompt lengths whose prefill at 2 threads is timed too, e.g. 512,1500")
    ap.add_argument("--simd", default=None,
                    help="SPECDEC_SIMD for the children (e.g. avx2: the kernels of CPUs without "
                         "AVX-512 on one that has it); default: this CPU's best")
    ap.add_argument("--attention", action="store_true",
                    help="time the forwards' CPU attention alone too")
    a = ap.parse_args()
    model = a.model
    if model is None:
        from specdec import hub

        model = hub.resolve(hub.DEFAULT_MODEL)
    tokens = [int(t) for t in a.tokens.split(",")]
    prefill = [int(t) for t in a.prefill.split(",") if t]
    where = {b: b.rsplit("@", 1) if "@" in b else (b, a.simd) for b in a.builds}
    for b, (path, _) in where.items():  # a path to the package itself imports the installed one
        if path != "-" and not os.path.isfile(os.path.join(path, "specdec", "__init__.py")):
            ap.error(f"{path}: no specdec/ package in it (give the directory that holds specdec/)")
    res: dict = {b: [] for b in a.builds}
    for _ in range(a.rounds):
        for b in a.builds:
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECDEC_SIMD")}
            env.setdefault("OPENBLAS_NUM_THREADS", "1")
            path, simd = where[b]
            if simd is not None:
                env["SPECDEC_SIMD"] = simd
            if path != "-":
                env["PYTHONPATH"] = os.path.abspath(path)
            r = subprocess.run([sys.executable, "-c", CHILD, model, str(a.context), str(a.reps),
                                str(a.iters), a.tokens, a.prefill, str(int(a.attention))],
                               env=env,
                               capture_output=True, text=True, check=True, cwd=os.sep)
            res[b].append(json.loads(r.stdout))
    print(f"context {a.context}, median of {a.rounds} rounds"
          + (f", SPECDEC_SIMD={a.simd}" if a.simd is not None else ""))
    print("| build | threads | " + " | ".join(f"T={T} ms" for T in tokens) + " | " +
          " | ".join(f"T={T} / T={tokens[0]}" for T in tokens[1:]) + " |")
    print("|---|---|" + "---|" * (2 * len(tokens) - 1))
    for b in a.builds:
        med = {k: float(np.median([o[k] for o in res[b]])) for k in res[b][0]}
        for th in (1, 2):
            t = [med[f"{th}-{T}"] for T in tokens]
            print(f"| {b} | {th} | " + " | ".join(f"{1e3 * x:.2f}" for x in t) + " | " +
                  " | ".join(f"{x / t[0]:.2f}x" for x in t[1:]) + " |")
    if a.attention:
        print(f"\nthe attention alone ({a.context} slots + T), median of rounds")
        print("| build | threads | " + " | ".join(f"T={T} ms" for T in tokens) + " |")
        print("|---|---|" + "---|" * len(tokens))
        for b in a.builds:
            if f"att-1-{tokens[0]}" not in res[b][0]:
                continue
            for th in (1, 2):
                print(f"| {b} | {th} | " + " | ".join(
                    f"{1e3 * float(np.median([o[f'att-{th}-{T}'] for o in res[b]])):.2f}"
                    for T in tokens) + " |")
    if prefill:
        print("\nprefill at 2 threads, best of 3 per round, median of rounds")
        print("| build | " + " | ".join(f"{P} tokens ms" for P in prefill) + " |")
        print("|---|" + "---|" * len(prefill))
        for b in a.builds:
            print(f"| {b} | " + " | ".join(
                f"{1e3 * float(np.median([o[f'prefill-{P}'] for o in res[b]])):.0f}"
                for P in prefill) + " |")


if __name__ == "__main__":
    main()
