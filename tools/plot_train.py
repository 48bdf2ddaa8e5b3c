"""Plot an EAGLE-3 training run's loss and accuracy curves (matplotlib).

Reads WORK/train_log.csv (one row per step) and WORK/eval_log.csv (held-out evaluations)
written by ``python -m specdec.train eagle3`` and writes a PNG:

    python tools/plot_train.py WORK [--out WORK/curves.png] [--smooth 25]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np


def read_csv(path: str):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return {k: np.array([float(r[k]) for r in rows]) for k in (rows[0] if rows else {})}


def smooth(y: np.ndarray, n: int) -> np.ndarray:
    if n <= 1 or len(y) < n:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    head = c[1:n] / np.arange(1, n)
    return np.concatenate([head, (c[n:] - c[:-n]) / n])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work")
    ap.add_argument("--out")
    ap.add_argument("--smooth", type=int, default=25, help="moving average over N steps")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr = read_csv(os.path.join(args.work, "train_log.csv"))
    ev_path = os.path.join(args.work, "eval_log.csv")
    ev = read_csv(ev_path) if os.path.exists(ev_path) else {}
    steps = [k for k in tr if k.startswith("loss") and k[4:].isdigit()]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k in steps:
        i = int(k[4:])
        a1.plot(tr["step"], smooth(tr[k], args.smooth), label=f"train, draft step {i + 1}")
        if k in ev:
            a1.plot(ev["step"], ev[k], "o--", ms=3, label=f"held out, draft step {i + 1}")
    a1.set_xlabel("step")
    a1.set_ylabel("cross-entropy to the target (nats)")
    a1.set_title("loss")
    a1.legend(fontsize=7)
    for k in steps:
        i = int(k[4:])
        a2.plot(tr["step"], smooth(tr[f"acc{i}"], args.smooth), label=f"train, step {i + 1}")
        if f"acc{i}" in ev:
            a2.plot(ev["step"], ev[f"acc{i}"], "o--", ms=3, label=f"held out, step {i + 1}")
        if f"chain{i}" in ev and i > 0:
            a2.plot(ev["step"], ev[f"chain{i}"], "x:", ms=4,
                    label=f"held out, steps 1..{i + 1} all right")
    a2.set_xlabel("step")
    a2.set_ylabel("top-1 agreement with the target")
    a2.set_title("accuracy")
    a2.legend(fontsize=7)
    fig.tight_layout()
    out = args.out or os.path.join(args.work, "curves.png")
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
