"""How far can prompt lookup go on a model's own answers? An exact analysis at temperature 0.

Greedy speculative decoding emits exactly the plain greedy tokens, so whether a prompt-lookup
draft would be accepted at an output position is decided by the plain output alone: the
accepted length is how many of the drafted tokens equal the tokens that follow. This script
decodes each Spec-Bench question once (plain, greedy), then replays prompt lookup over every
output position and reports

* by the size n of the n-gram that matched: how often it happens and how many of k = 8 drafted
  tokens would be accepted (the signal the adaptive draft length uses), and
* per category, tau = tokens per target forward if verifying were free, for fixed k: the
  ceiling of any prompt-lookup speedup on this model, whatever the hardware, and
* the same for trees of drafts (--tree-nodes): every continuation that follows a match of the
  last n tokens (n from max_ngram down to 1, the latest match first) merged into one tree of
  at most N drafted tokens, depth 8, as a tree-verifying loop could propose them.

    python benchmarks/lookup_ceiling.py --data spec_bench_dev.jsonl --limit 10
    python benchmarks/lookup_ceiling.py --data spec_bench_dev.jsonl --limit 10 --tree-nodes 8,16,32
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict

import specdec
from specdec import _core
from specdec.bench import load_questions
from specdec.hub import DEFAULT_MODEL


def lookup(h, k, max_ngram, min_ngram=1):
    """The prompt-lookup draft of specdec's C loop (sd_lookup_draft, through
    `_core.lookup_draft`): (draft tokens, matched n), ([], 0) without a match. (Tables in
    benchmarks/RESULTS.md before 2026-12-02's lookup change were made with the earlier rule:
    the latest occurrence, its continuation cut at the end of the text.)"""
    draft, n, _ = _core.lookup_draft(h, k, max_ngram, min_ngram)
    return draft, n


def lookup_tree(h, budget, depth, max_ngram, min_ngram=1):
    """A trie (nested dicts, token -> subtree) of up to `budget` drafted tokens: the
    continuations (up to `depth` tokens) of every match of the last n tokens of h, longest n
    first, latest match first."""
    L = len(h)
    root, nodes = {}, 0
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= L:
            continue
        tail = h[L - n:]
        for i in range(L - n - 1, -1, -1):
            if h[i:i + n] != tail:
                continue
            node = root
            for t in h[i + n:i + n + depth]:
                if t not in node:
                    if nodes == budget:
                        return root
                    node[t] = {}
                    nodes += 1
                node = node[t]
    return root


def tree_accepted_length(tree, out, pos):
    """How many tokens of out from pos a greedy tree verification would accept."""
    a, node = 0, tree
    while pos + a < len(out) and out[pos + a] in node:
        node = node[out[pos + a]]
        a += 1
    return a


def accepted_length(draft, out, pos):
    a = 0
    for j, t in enumerate(draft):
        if pos + j < len(out) and out[pos + j] == t:
            a += 1
        else:
            break
    return a


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--limit", type=int, default=10, help="questions per category (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-ngram", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--tree-nodes", default="",
                   help="also trees of drafts of these sizes, e.g. 8,16,32 (depth 8)")
    args = p.parse_args(argv)
    trees = [int(x) for x in args.tree_nodes.split(",") if x]

    model = specdec.load(args.model, threads=args.threads)
    tok = model.require_tokenizer()
    rows = load_questions(args.data, args.limit)
    by_n = defaultdict(lambda: [0, 0, Counter()])  # n -> positions, accepted sum, histogram
    KS = (1, 2, 4, 8)
    # cat -> k (or "treeN") -> [tokens, steps]
    tau = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for i, r in enumerate(rows):
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": r["turns"][0]}]))
        out = specdec.generate(model, ids, max_new_tokens=args.max_new_tokens).tokens
        drafts = [lookup(ids + out[:pos], 8, args.max_ngram) for pos in range(len(out))]
        for pos, (d, n) in enumerate(drafts):
            a = accepted_length(d, out, pos)
            s = by_n[n]
            s[0] += 1
            s[1] += a
            s[2][a] += 1
        for k in KS:  # replay the loop: each step drafts up to k, keeps the accepted + 1
            pos = 0
            t = tau[r["category"]][k]
            while pos < len(out):
                d, _ = drafts[pos]
                d = d[:min(k, len(out) - pos - 1)]
                pos += accepted_length(d, out, pos) + 1
                t[1] += 1
            t[0] += len(out)
        for nodes in trees:  # the same replay with a tree of drafts per step
            pos = 0
            t = tau[r["category"]][f"tree{nodes}"]
            while pos < len(out):
                tree = lookup_tree(ids + out[:pos], nodes, 8, args.max_ngram)
                pos += min(tree_accepted_length(tree, out, pos), len(out) - pos - 1) + 1
                t[1] += 1
            t[0] += len(out)
        print(f"\r{i + 1}/{len(rows)} questions", end="", file=sys.stderr)
    print(file=sys.stderr)

    total = sum(s[0] for s in by_n.values())
    print(f"model {args.model}, {len(rows)} questions, {total} output positions, "
          f"max_ngram {args.max_ngram}\n")
    print("| matched n-gram | share of positions | mean accepted of 8 | all 8 accepted |")
    print("|---|---|---|---|")
    for n in sorted(by_n):
        s = by_n[n]
        label = "none (no draft)" if n == 0 else str(n)
        mean = f"{s[1] / s[0]:.2f}" if n else "-"
        full = f"{s[2][8] / s[0]:.0%}" if n else "-"
        print(f"| {label} | {s[0] / total:.0%} | {mean} | {full} |")
    print("\ntau (tokens per target forward) if verification were free:\n")
    cols = list(KS) + [f"tree{n}" for n in trees]
    print("| category | " + " | ".join(f"k={k}" if isinstance(k, int) else
                                       f"tree of {k[4:]}" for k in cols) + " |")
    print("|---|" + "---|" * len(cols))
    overall = {k: [0, 0] for k in cols}
    for cat in sorted(tau):
        cells = []
        for k in cols:
            t = tau[cat][k]
            overall[k][0] += t[0]
            overall[k][1] += t[1]
            cells.append(f"{t[0] / t[1]:.2f}")
        print(f"| {cat} | " + " | ".join(cells) + " |")
    print("| overall | " + " | ".join(f"{overall[k][0] / overall[k][1]:.2f}" for k in cols) +
          " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
