"""How often an EAGLE head's first draft is the target's greedy token, on a question set.

For each question (the first turn of a Spec-Bench-style JSONL, through the chat template) the
target answers greedily (``--max-new-tokens``); then each head's teacher-forced logits over
prompt + answer (``Eagle.draft_logits``) give its first draft at every answer position, and the
tool counts how often that draft is the answer's next token. At temperature 0 the target
accepts a first draft exactly then, so this is the acceptance of a chain's first node, free of
timing noise and of the tree sizing: a way to compare heads (two trainings, two packings) on the
questions one reports speed on, which a head must never be trained on.

    python tools/head_agreement.py --data QUESTIONS.jsonl --heads smollm2-135m-instruct DIR \\
        [--target smollm2-135m-instruct] [--limit 3] [--max-new-tokens 128]

``--heads`` takes aliases or directories; ``--limit`` keeps the first N questions of each
category; ``--windows 512,0`` measures each head with each sliding window (0: the whole text;
default: the head's own). Prints one row per category, a column per head, and the overall
agreement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import specdec  # noqa: E402


def questions(path: str, limit: int):
    per_cat: "OrderedDict[str, list]" = OrderedDict()
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            cat = r.get("category", "all")
            rows = per_cat.setdefault(cat, [])
            if limit <= 0 or len(rows) < limit:
                rows.append(r["turns"][0])
    return per_cat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--heads", nargs="+", required=True)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--windows", default="",
                    help="sliding windows to measure each head with, comma-separated")
    args = ap.parse_args()

    model = specdec.load(args.target, threads=args.threads)
    tok = model.require_tokenizer()
    windows = [int(w) for w in args.windows.split(",") if w.strip()] or [None]
    named = [(h if w is None else f"{h} w={w}", specdec.Eagle(h, window=w))
             for h in args.heads for w in windows]
    names = [n for n, _ in named]
    hits = {n: {} for n in names}
    counts = {}
    for cat, turns in questions(args.data, args.limit).items():
        counts[cat] = 0
        for n in names:
            hits[n][cat] = 0
        for turn in turns:
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": turn}]))
            if len(ids) + args.max_new_tokens > model.config.context_length:
                continue
            g = specdec.generate(model, ids, max_new_tokens=args.max_new_tokens)
            seq = list(ids) + list(g.tokens)
            n = len(g.tokens)
            if n < 2:
                continue
            truth = np.asarray(seq[len(ids) + 1:])  # answer tokens a head can draft first
            counts[cat] += len(truth)
            for name, head in named:
                lg = head.draft_logits(model, seq)
                # row t drafts token t + 2: rows len(ids) - 1 .. len(seq) - 3
                rows = lg[len(ids) - 1:len(seq) - 2]
                hits[name][cat] += int((rows.argmax(axis=1) == truth).sum())
    width = max(len(h) for h in names)
    print(f"{'category':<16} {'tokens':>7}  " + "  ".join(f"{h:>{width}}" for h in names))
    for cat, n in counts.items():
        cells = "  ".join(f"{hits[h][cat] / max(n, 1):>{width}.3f}" for h in names)
        print(f"{cat:<16} {n:>7}  {cells}")
    total = sum(counts.values())
    cells = "  ".join(f"{sum(hits[h].values()) / max(total, 1):>{width}.3f}" for h in names)
    print(f"{'overall':<16} {total:>7}  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
