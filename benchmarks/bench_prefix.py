"""Prefix reuse on a chat: the time to the first token of each turn, with the model keeping the
caches of finished requests (``Model.prefix_cache = 4``, the default) and without (0).

A chat of several turns over a long system prompt (SmolLM2-135M-Instruct, its chat template):
each turn's prompt is the whole conversation so far, so without reuse every turn computes all
of it again, and with reuse only what the previous turn's cache does not hold (the new user
message, and whatever the template renders differently from the tokens generated). Each turn is
timed as ``generate(..., max_new_tokens=1)`` (the prefill and one token) right after the
previous turn's full answer, in rounds that alternate the two settings; medians.

    python benchmarks/bench_prefix.py --turns 4 --repeats 3 --threads 2
    python benchmarks/bench_prefix.py --eagle --turns 4 --repeats 3 --threads 2

With ``--eagle`` every request drafts with the shipped EAGLE-3 head (or the head named), whose
pooled caches carry the target features it reads.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import specdec
from specdec import hub

SYSTEM = ("You are a patient assistant for a small library. " * 12 +
          "Answer in two or three short sentences.")
QUESTIONS = ["What does a library card let me do?", "How long can I keep a book?",
             "What happens if I return it late?", "Can I reserve a book online?",
             "Do you lend e-books too?", "How do I renew a loan?"]


def chat(model: specdec.Model, turns: int, answer_tokens: int, spec=None) -> list:
    """Time to first token of each turn (seconds) and the tokens reused, one conversation;
    spec: the speculator of every request (None: plain decoding)."""
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        t0 = time.perf_counter()
        first = specdec.generate(model, messages, max_new_tokens=1, speculator=spec)
        ttft = time.perf_counter() - t0
        g = specdec.generate(model, messages, max_new_tokens=answer_tokens, speculator=spec)
        out.append((ttft, first.prefix_reused, len(first.prompt_tokens)))
        messages.append({"role": "assistant", "content": g.text})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--answer-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eagle", nargs="?", const=hub.DEFAULT_MODEL, default=None,
                    help="draft with this EAGLE head (alias or directory; alone: the shipped "
                         "head of the default model)")
    args = ap.parse_args()
    model = specdec.load(hub.resolve(hub.DEFAULT_MODEL), threads=args.threads)
    spec = specdec.Eagle(args.eagle) if args.eagle else None  # loaded once, outside the timing
    runs: dict = {0: [], 4: []}
    for r in range(args.repeats):
        for n in ((0, 4) if r % 2 == 0 else (4, 0)):
            model.prefix_cache = 0  # empty the pool between conversations
            model.prefix_cache = n
            runs[n].append(chat(model, args.turns, args.answer_tokens, spec))
    print(f"# {platform.machine()}, specdec kernels: {specdec._core.simd_name()}, "
          f"{args.threads} threads, {args.repeats} conversations per setting (medians), "
          f"{'EAGLE head ' + args.eagle if args.eagle else 'plain decoding'}")
    print("| turn | prompt tokens | reused | time to first token, no reuse (ms) | with reuse (ms) "
          "| ratio |")
    print("|---|---|---|---|---|---|")
    for t in range(args.turns):
        cold = statistics.median(run[t][0] for run in runs[0]) * 1e3
        warm = statistics.median(run[t][0] for run in runs[4]) * 1e3
        reused = statistics.median(run[t][1] for run in runs[4])
        n = runs[4][0][t][2]
        print(f"| {t + 1} | {n} | {reused:.0f} | {cold:.1f} | {warm:.1f} | {warm / cold:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
