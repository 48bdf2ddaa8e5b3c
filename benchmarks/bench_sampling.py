"""What processing one row of logits for sampling costs (temperature, top-k, top-p, min-p:
`_core.process_logits`, the step every sampled token and every speculative row goes through),
on real rows: the logits of greedy SmolLM2 answers to four prompts of different kinds, 64 rows
each (how flat a row is decides what top-p costs). One or more
builds side by side, child processes alternating as in ab_builds.py, medians over rounds, in
microseconds a row.

    python benchmarks/bench_sampling.py - --rounds 3
    python benchmarks/bench_sampling.py before/ after/ --rounds 5 --settings 1,0,0.95,0 1,50,0.95,0

A setting is temperature,top_k,top_p,min_p; "-" names the installed specdec.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

SETTINGS = ["1,0,1,0", "1,0,0.95,0", "0.7,0,0.9,0", "0.7,40,0.9,0", "1,50,0.95,0",
            "0.7,0,1,0.05", "0,0,1,0"]
PROMPTS = ["Explain in a few sentences why the sky is blue.",
           "Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "Give me three ideas for a birthday party for a ten-year-old.",
           "Translate into English: Der Zug kommt heute wegen des Schnees später an."]

CHILD = r"""
import json, sys, time
import numpy as np
import specdec
from specdec import _core
m = specdec.load(sys.argv[1], threads=2)
tok = m.require_tokenizer()
rows = []
for prompt in json.loads(sys.argv[2]):
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))
    g = specdec.generate(m, ids, max_new_tokens=64, temperature=0.0)
    n = len(g.tokens)
    rows.extend(m.logits(list(ids) + list(g.tokens))[-n:].astype(np.float32))
reps = int(sys.argv[3])
out = {}
for st in sys.argv[4].split(";"):
    t, k, p, mp = st.split(",")
    args = (float(t), int(k), float(p), float(mp))
    for r in rows[:4]:
        _core.process_logits(r, *args)
    t0 = time.perf_counter()
    for _ in range(reps):
        for r in rows:
            _core.process_logits(r, *args)
    out[st] = (time.perf_counter() - t0) / (reps * len(rows))
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+",
                    help="directories holding a built specdec ('-': installed)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5, help="passes over the rows per round")
    ap.add_argument("--settings", nargs="+", default=SETTINGS,
                    help="temperature,top_k,top_p,min_p each")
    a = ap.parse_args()
    for st in a.settings:
        parts = st.split(",")
        if len(parts) != 4:
            ap.error(f"setting {st!r}: want temperature,top_k,top_p,min_p")
    model = a.model
    if model is None:
        from specdec import hub

        model = hub.resolve(hub.DEFAULT_MODEL)
    for b in a.builds:
        if b != "-" and not os.path.isfile(os.path.join(b, "specdec", "__init__.py")):
            ap.error(f"{b}: no specdec/ package in it (give the directory that holds specdec/)")
    res: dict = {b: [] for b in a.builds}
    for _ in range(a.rounds):
        for b in a.builds:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env.setdefault("OPENBLAS_NUM_THREADS", "1")
            if b != "-":
                env["PYTHONPATH"] = os.path.abspath(b)
            r = subprocess.run([sys.executable, "-c", CHILD, model, json.dumps(PROMPTS),
                                str(a.reps), ";".join(a.settings)], env=env,
                               capture_output=True, text=True, check=True, cwd=os.sep)
            res[b].append(json.loads(r.stdout))
    print(f"us a row of logits, {len(PROMPTS)} answers' rows, median of {a.rounds} rounds "
          "(setting: temperature, top-k, top-p, min-p)")
    print("| setting | " + " | ".join(a.builds) + " |")
    print("|---|" + "---|" * len(a.builds))
    for st in a.settings:
        print(f"| {st} | " + " | ".join(
            f"{1e6 * float(np.median([o[st] for o in res[b]])):.1f}" for b in a.builds) + " |")


if __name__ == "__main__":
    main()
