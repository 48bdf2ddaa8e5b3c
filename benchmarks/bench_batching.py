"""Continuous batching: N requests at once on one model, each in its own thread, against the
same N requests one after the other, in one run (interleaved, repeated); reports the throughput
ratio, the requests per forward (Model.scheduler_stats) and whether every output equals the
request's output alone.

    python benchmarks/bench_batching.py --model smollm2-135m-instruct --requests 1,2,4,8
    python benchmarks/bench_batching.py --speculator lookup --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import platform
import threading
import time
from typing import List

import specdec
from specdec import _core

QUESTIONS = ["Write a short story about a cat.", "Explain photosynthesis to a child.",
             "List five uses of a paper clip.", "Why is the sky blue?",
             "Describe a walk in a forest.", "What makes a good friend?",
             "Write a poem about the sea.", "How do airplanes fly?"]


def speculator(name: str):
    return {"plain": lambda: None, "lookup": lambda: specdec.PromptLookup(),
            "recycling": lambda: specdec.TokenRecycling()}[name]()


def one(model, i: int, args) -> List[int]:
    q = QUESTIONS[i % len(QUESTIONS)]
    return specdec.generate(model, [{"role": "user", "content": q}],
                            max_new_tokens=args.max_new_tokens, stop_tokens=[],
                            speculator=speculator(args.speculator)).tokens


def together(model, n: int, args) -> List[List[int]]:
    out: List[List[int]] = [[] for _ in range(n)]
    barrier = threading.Barrier(n)

    def work(i: int) -> None:
        barrier.wait()
        out[i] = one(model, i, args)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", default="1,2,4,8", help="request counts to measure")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--speculator", default="plain", choices=["plain", "lookup", "recycling"])
    ap.add_argument("--threads", type=int, default=2, help="the model's worker threads")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    model = specdec.load(args.model, threads=args.threads)
    model.prefix_cache = 0  # each request computes its own prompt, in both arms
    print(f"# {platform.processor() or platform.machine()}, kernels {_core.simd_name()}, "
          f"{args.threads} threads, {args.model}, {args.speculator}, "
          f"{args.max_new_tokens} new tokens per request")
    print("| requests | one after the other (s) | at once (s) | throughput ratio | "
          "requests per forward | outputs identical |")
    print("|---|---|---|---|---|---|")
    for n in [int(x) for x in args.requests.split(",")]:
        seq_t, con_t, same, steps, fwds = [], [], True, 0, 0
        for _ in range(args.repeats):  # interleaved: alone, together, alone, together
            t = time.perf_counter()
            alone = [one(model, i, args) for i in range(n)]
            seq_t.append(time.perf_counter() - t)
            s0 = model.scheduler_stats
            t = time.perf_counter()
            got = together(model, n, args)
            con_t.append(time.perf_counter() - t)
            s1 = model.scheduler_stats
            steps += s1["steps"] - s0["steps"]
            fwds += s1["forwards"] - s0["forwards"]
            same = same and got == alone
        a, c = min(seq_t), min(con_t)
        print(f"| {n} | {a:.2f} | {c:.2f} | {a / c:.2f}x | {steps / max(fwds, 1):.2f} | "
              f"{'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
