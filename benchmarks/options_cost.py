"""What logprobs and penalties cost a decoding call: the same questions decoded with and without
them, interleaved question by question (each configuration's order rotated), reported as the
ratio of total times, for plain decoding and for a speculator. Penalties change the tokens, so
their rows compare decoding of other answers (tokens per second); logprobs leave the tokens as
they are.

    python benchmarks/options_cost.py --data ../shared/eval/spec_bench_dev.jsonl --limit 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import specdec

CONFIGS = {
    "base": {},
    "logprobs": {"logprobs": True},
    "top_logprobs=5": {"top_logprobs": 5},
    "penalties": {"repetition_penalty": 1.1, "frequency_penalty": 0.2, "presence_penalty": 0.2},
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True, help="Spec-Bench-style JSONL (category, turns)")
    p.add_argument("--limit", type=int, default=2, help="questions per category")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    model = specdec.load(args.model, threads=args.threads)
    tok = model.require_tokenizer()
    per_cat: dict = defaultdict(list)
    for line in open(args.data, encoding="utf-8"):
        r = json.loads(line)
        if len(per_cat[r["category"]]) < args.limit:
            per_cat[r["category"]].append(r["turns"][0])
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
               for qs in per_cat.values() for q in qs]
    specs = {"plain": lambda: None, "lookup-tree": lambda: specdec.PromptLookup(branching=3)}
    names = list(CONFIGS)
    secs: dict = defaultdict(float)
    toks: dict = defaultdict(int)
    for method, make in specs.items():
        spec = make()
        specdec.generate(model, prompts[0], max_new_tokens=4, speculator=spec)  # warm-up
        for i, ids in enumerate(prompts):
            for name in names[i % len(names):] + names[:i % len(names)]:
                t0 = time.perf_counter()
                g = specdec.generate(model, ids, max_new_tokens=args.max_new_tokens,
                                     speculator=spec, **CONFIGS[name])
                secs[method, name] += time.perf_counter() - t0
                toks[method, name] += len(g.tokens)
    print(f"model {model.path}, {model.threads} threads, {len(prompts)} questions, "
          f"max_new_tokens {args.max_new_tokens}, temperature 0\n")
    print("| method | option | tok/s | time against base | tok/s against base |")
    print("|---|---|---|---|---|")
    for method in specs:
        base_s, base_t = secs[method, "base"], toks[method, "base"]
        for name in names:
            s, t = secs[method, name], toks[method, name]
            print(f"| {method} | {name} | {t / s:.1f} | {s / base_s:.3f}x | "
                  f"{(t / s) / (base_t / base_s):.3f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
