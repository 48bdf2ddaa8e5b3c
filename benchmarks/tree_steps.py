"""What a tree step really costs, and what Token Recycling's templates accept.

`costs`: the seconds of a speculative step of a fixed size in real generation (draft, verify
forward with its tree mask, the rows' processing, acceptance and cache compaction: the
`time_draft_s + time_verify_s` of Generation.stats over its steps) over a plain token's seconds
(plain decoding's time after the prefill, per token), for trees of 1, 2, 4, 8 and 16 nodes
(TokenRecycling with a fixed template, so every step has that size once the table is full),
beside the curve the sizing speculators measure on the model (`verify_costs`: bare forwards).

`tau`: tokens per step of Token Recycling's templates with and without prompt lookup's branch
(`lookup`), the whole template every step and the adaptive cut, at temperature 0 on questions
of the dev half (two per category): each speculator answers every question twice and the
second pass is counted (its table learnt in the first); every answer is checked against plain
decoding's.

`split`: where the steps of a `python -m specdec.bench --json` run went, per method: tokens
per step, nodes verified per step, and the milliseconds of a step spent drafting and verifying
(verify forward, the rows' processing, acceptance, the drafter's commit), each also in plain
decoding's tokens (its time after the prefill, per token, in the same run).

    python benchmarks/tree_steps.py costs --data ../shared/eval/spec_bench_dev.jsonl
    python benchmarks/tree_steps.py tau --data ../shared/eval/spec_bench_dev.jsonl
    python benchmarks/tree_steps.py split --json RUN.json [RUN2.json ...]
"""

from __future__ import annotations

import argparse
import json
import time

import specdec

TEMPLATES = {1: (1,), 2: (1, 1), 4: (1, 1, 1, 1), 8: (2, 2, 1, 1, 1, 1), 16: (4, 2, 2, 1, 1, 1)}


def questions(path, cats, per):
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    by = {}
    for r in rows:
        if cats is None or r["category"] in cats:
            by.setdefault(r["category"], []).append(r)
    return [r for rs in by.values() for r in rs[:per]]


def costs(m, prompts, rounds):
    specs = {n: specdec.TokenRecycling(nodes=n, widths=w, adaptive=False)
             for n, w in TEMPLATES.items()}
    for x in prompts[:3]:  # the tables fill
        for s in specs.values():
            specdec.generate(m, x, max_new_tokens=64, speculator=s)
    secs = {k: 0.0 for k in ["plain", *specs]}
    count = dict.fromkeys(secs, 0)
    for _ in range(rounds):
        for x in prompts:
            t0 = time.perf_counter()
            specdec.generate(m, x, max_new_tokens=1)
            pre = time.perf_counter() - t0
            t0 = time.perf_counter()
            g = specdec.generate(m, x, max_new_tokens=129, stop_tokens=[])
            secs["plain"] += time.perf_counter() - t0 - pre
            count["plain"] += len(g.tokens) - 1
            for n, s in specs.items():
                st = specdec.generate(m, x, max_new_tokens=128, stop_tokens=[], speculator=s).stats
                secs[n] += st.time_draft_s + st.time_verify_s
                count[n] += st.steps
    one = secs["plain"] / count["plain"]
    measured = specdec.TokenRecycling(nodes=16)
    measured.warm_up(m)
    curve = measured.verify_costs
    print(f"plain decoding: {1e3 * one:.3f} ms a token")
    print("| tokens verified | ms a step | over a plain token | measured forward curve |")
    print("|---|---|---|---|")
    for n in specs:
        step = secs[n] / count[n]
        print(f"| {n + 1} | {1e3 * step:.3f} | {step / one:.2f}x | {curve[n]:.2f}x |")


def tau(m, prompts):
    plain = [specdec.generate(m, x, max_new_tokens=128).tokens for x in prompts]
    rows = []
    for adaptive in (False, True):
        for n in (4, 8, 16):
            for lookup in (0, 16):
                if adaptive and n != 16:
                    continue
                s = specdec.TokenRecycling(nodes=n, widths=TEMPLATES[n], adaptive=adaptive,
                                           lookup=lookup)
                for _ in range(2):  # the second pass counts: the table learnt in the first
                    new = steps = nodes = 0
                    for x, ref in zip(prompts, plain):
                        g = specdec.generate(m, x, max_new_tokens=128, speculator=s)
                        assert g.tokens == ref, "a speculator changed the greedy output"
                        new += g.stats.new_tokens
                        steps += g.stats.steps
                        nodes += sum(k * v for k, v in g.stats.steps_by_nodes.items())
                rows.append((n, "adaptive" if adaptive else "whole", lookup, new / steps,
                             nodes / steps))
    print("| template nodes | cut | lookup | tau | nodes a step |")
    print("|---|---|---|---|---|")
    for n, cut, lookup, t, k in rows:
        print(f"| {n} | {cut} | {lookup} | {t:.2f} | {k:.2f} |")


def split(paths):
    print("| run | method | steps | tau | nodes/step | draft ms/step | verify ms/step "
          "| draft, plain tokens | verify, plain tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path, encoding="utf-8") as f:
            qs = json.load(f)["questions"]
        sums = {}
        for q in qs:
            for name, r in q["methods"].items():
                s = sums.setdefault(name, dict.fromkeys(
                    ("decode", "tokens", "steps", "nodes", "draft", "verify"), 0.0))
                s["decode"] += r["time_s"] - q["prefill_s"]
                s["tokens"] += r["new_tokens"]
                if "steps" in r:
                    s["steps"] += r["steps"]
                    s["nodes"] += sum(int(k) * v for k, v in r["steps_by_nodes"].items())
                    s["draft"] += r.get("time_draft_s", float("nan"))
                    s["verify"] += r.get("time_verify_s", float("nan"))
        plain = sums.pop("plain")
        token_ms = 1e3 * plain["decode"] / plain["tokens"]
        print(f"| {path} | plain | | | | | {token_ms:.3f} a token | | |")
        for name, s in sums.items():
            n = max(s["steps"], 1)
            d, v = 1e3 * s["draft"] / n, 1e3 * s["verify"] / n
            print(f"| {path} | {name} | {s['steps']:.0f} | {s['tokens'] / n:.2f} "
                  f"| {s['nodes'] / n:.2f} | {d:.3f} | {v:.3f} | {d / token_ms:.3f} "
                  f"| {v / token_ms:.3f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["costs", "tau", "split"])
    p.add_argument("--data", help="Spec-Bench-format JSONL (costs, tau)")
    p.add_argument("--json", nargs="+", help="split: JSON files of python -m specdec.bench")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--per", type=int, default=2, help="questions per category")
    p.add_argument("--rounds", type=int, default=2, help="costs: passes over the questions")
    a = p.parse_args()
    if a.what == "split":
        if not a.json:
            p.error("split needs --json")
        split(a.json)
        return
    if not a.data:
        p.error(f"{a.what} needs --data")
    m = specdec.load(a.model, threads=a.threads)
    m.prefix_cache = 0
    tok = m.require_tokenizer()
    # costs: short prompts, so that every step's context is about the same
    cats = {"qa", "math_reasoning", "writing", "coding"} if a.what == "costs" else None
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": r["turns"][0]}]))
               for r in questions(a.data, cats, a.per * (4 if a.what == "costs" else 1))]
    print(f"{a.model}, {a.threads} threads, {len(prompts)} questions")
    if a.what == "costs":
        costs(m, prompts, a.rounds)
    else:
        tau(m, prompts)


if __name__ == "__main__":
    main()
