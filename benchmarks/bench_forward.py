"""Forward-pass speed of specdec's CPU core on a SmolLM2-135M-shaped model with random weights.

Reports, per thread count, the median over repeats of
  * prefill tokens/s (one forward over P prompt tokens),
  * decode tokens/s (one-token forwards over a warm cache) and the effective bandwidth:
    bytes of weights one forward reads (Model.weight_bytes) / time per token,
  * the verify-batch cost curve: time of one forward over T = 1..16 tokens relative to T = 1.
Thread counts are interleaved within each repeat so that machine noise hits them alike.

    python benchmarks/bench_forward.py                 # writes a random F16 model to a temp dir
    python benchmarks/bench_forward.py --model m.gguf  # any model file
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import specdec
from specdec import _core, testing


def time_prefill(model, n_tokens: int) -> float:
    cache = model.new_cache(n_tokens + 64)
    tokens = [(13 * i + 1) % model.config.vocab_size for i in range(n_tokens)]
    t0 = time.perf_counter()
    model.forward(cache, tokens, n_logits=1)
    return time.perf_counter() - t0


def time_decode(model, prompt_len: int, steps: int) -> float:
    """Seconds per decoded token after a prompt of prompt_len tokens."""
    cache = model.new_cache(prompt_len + steps + 1)
    model.forward(cache, [(5 * i + 2) % model.config.vocab_size for i in range(prompt_len)],
                  n_logits=1)
    t0 = time.perf_counter()
    for i in range(steps):
        model.forward(cache, [(11 * i + 7) % model.config.vocab_size], n_logits=1)
    return (time.perf_counter() - t0) / steps


def time_verify(model, prompt_len: int, sizes, inner: int) -> dict:
    """Seconds of one forward over T tokens (all T rows of logits, as a verify step needs)."""
    cache = model.new_cache(prompt_len + max(sizes) + 1)
    model.forward(cache, [(3 * i + 1) % model.config.vocab_size for i in range(prompt_len)],
                  n_logits=1)
    out = {}
    for T in sizes:
        toks = [(17 * j + 5) % model.config.vocab_size for j in range(T)]
        t0 = time.perf_counter()
        for _ in range(inner):
            cache.rollback(prompt_len)
            model.forward(cache, toks)
        out[T] = (time.perf_counter() - t0) / inner
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model file (default: random SmolLM2-135M shape, F16)")
    p.add_argument("--dtype", default="F16", choices=["F32", "F16"])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--prefill", type=int, default=128)
    p.add_argument("--context", type=int, default=64, help="prompt length before decode/verify")
    p.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the raw numbers here")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    sizes = [1, 2, 4, 8, 16]

    tmp = None
    path = args.model
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="specdec-bench-")
        cfg = testing.SHAPES["smollm2-135m"]
        path = os.path.join(tmp.name, f"smollm2-135m-random-{args.dtype.lower()}.gguf")
        testing.write_gguf(path, cfg, testing.random_weights(cfg, seed=0), dtype=args.dtype)
    model = specdec.load(path)
    print(f"{model}\nweights read per forward: {model.weight_bytes / 1e6:.1f} MB; "
          f"kernels: {_core.simd_name()}; machine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs")

    raw = {t: {"prefill": [], "decode": [], "verify": {T: [] for T in sizes}} for t in threads}
    for r in range(args.repeats):
        for t in threads:  # interleaved
            model.threads = t
            raw[t]["prefill"].append(time_prefill(model, args.prefill))
            raw[t]["decode"].append(time_decode(model, args.context, args.steps))
            for T, s in time_verify(model, args.context, sizes, inner=3).items():
                raw[t]["verify"][T].append(s)
        print(f"repeat {r + 1}/{args.repeats} done", flush=True)

    med = statistics.median
    print()
    print(f"| threads | prefill {args.prefill} tok/s | decode tok/s | effective GB/s | "
          + " | ".join(f"T={T} / T=1" for T in sizes[1:]) + " |")
    print("|---|---|---|---|" + "---|" * (len(sizes) - 1))
    for t in threads:
        d = med(raw[t]["decode"])
        v1 = med(raw[t]["verify"][1])
        ratios = " | ".join(f"{med(raw[t]['verify'][T]) / v1:.2f}" for T in sizes[1:])
        print(f"| {t} | {args.prefill / med(raw[t]['prefill']):.0f} | {1 / d:.1f} | "
              f"{model.weight_bytes / d / 1e9:.1f} | {ratios} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": path, "weight_bytes": model.weight_bytes, "raw": raw}, f,
                      indent=1)
    if tmp is not None:
        del model
        tmp.cleanup()


if __name__ == "__main__":
    main()
