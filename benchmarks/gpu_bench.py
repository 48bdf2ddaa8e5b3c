"""Measurements for one GPU run (benchmarks/gpu_check.sh calls this after building and testing):

  (a) the memory-bandwidth ceiling: a device-to-device copy (bytes read + written / time);
  (b) decoding a dummy Llama-3-8B in BF16: tokens/s of plain greedy decoding, and the
      bandwidth one forward achieves (bytes of weights + KV read per token / forward time)
      against (a);
  (c) the verify cost: one forward over T = 1..16 tokens (all T rows of logits, left on the
      device as the loop leaves them) after a 64-token context, relative to T = 1;
      (b) and (c) again with BF16 on the tensor cores (SPECDEC_CUDA_MMA=1) and with Q4_K weights;
      (c) for BF16 and Q4_K with the activations never staged in shared memory
      (SPECDEC_CUDA_STAGE=0; by default they are where that measured faster);
  (d) speculative decoding with the synthetic-acceptance drafter (specdec.dummy) at
      alpha in {0.6, 0.8, 0.9} and K in {2, 4, 8}: speedup over plain decoding measured in the
      same run, next to the formula (1 - alpha^(K+1)) / ((1 - alpha) * cost(K + 1)) with the
      cost curve of (c);
  (e) T = 0 equality of CPU and CUDA on tiny random models (dummy weights, several types).

Each part runs in its own process (a fault in one cannot hide the others); the details go to
--out (JSON) and a short table is printed last. Nothing here reads a file beyond the
repository or touches the network.

    python3 benchmarks/gpu_bench.py --out gpu_bench.json

GPU_BENCH_PART_TIMEOUT (seconds, default 240) bounds each part; GPU_BENCH_SKIP (keys, comma-
separated, e.g. decode_mma,verify_mma) leaves parts out. GPU_BENCH_DEVICE=cpu
GPU_BENCH_SHAPE=tiny runs the same script on the CPU with a tiny shape (a check of the script,
not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPE = os.environ.get("GPU_BENCH_SHAPE", "llama-3-8b")
DEVICE = os.environ.get("GPU_BENCH_DEVICE", "cuda")  # "cpu": a dry run of the script itself
CONTEXT = 64
PROMPT = [(1000003 * (i + 1)) % 30000 + 1000 for i in range(16)]  # ordinary ids of any vocab


def part_copy() -> dict:
    from specdec import _core

    if DEVICE == "cpu":
        return {"GBps": None}
    nbytes = 4 << 30
    sec = _core.copy_bench(0, nbytes, 20)
    return {"bytes": nbytes, "seconds": sec, "GBps": 2 * nbytes / sec / 1e9}


def load_8b():
    import specdec

    global PROMPT
    t0 = time.perf_counter()
    m = specdec.dummy_model(SHAPE, os.environ.get("GPU_BENCH_DTYPE", "bf16"), device=DEVICE, seed=1)
    PROMPT = [t % m.config.vocab_size for t in PROMPT]
    return m, time.perf_counter() - t0


def part_decode() -> dict:
    import specdec

    m, t_load = load_8b()
    c = m.config
    kv_per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4  # f32 K and V
    fwd = m._core.bench_forward(1, CONTEXT, 50)
    bytes_read = m.weight_bytes + kv_per_token * (CONTEXT + 1)
    specdec.generate(m, PROMPT, max_new_tokens=8)  # warm-up (graphs)
    runs = []
    for _ in range(3):
        g = specdec.generate(m, PROMPT, max_new_tokens=128, stop_tokens=[])
        runs.append(g.time_s)
    t = sorted(runs)[1]
    return {"load_s": t_load, "weight_bytes": m.weight_bytes, "forward_s": fwd,
            "forward_GBps": bytes_read / fwd / 1e9, "generate_128_s": t,
            "tokens_per_s": 128 / t}


def part_verify() -> dict:
    m, _ = load_8b()
    cost = {}
    for T in range(1, 17):
        cost[T] = m._core.bench_forward(T, CONTEXT, 20)
    return {"seconds": cost, "relative": {T: cost[T] / cost[1] for T in cost}}


def part_synthetic(relative: dict) -> dict:
    import specdec
    from specdec.dummy import synthetic_speculation

    m, _ = load_8b()
    specdec.generate(m, PROMPT, max_new_tokens=8)
    plain = []
    for _ in range(2):
        plain.append(specdec.generate(m, PROMPT, max_new_tokens=128, stop_tokens=[]).time_s)
    t_plain = min(plain)
    rows = []
    for alpha in (0.6, 0.8, 0.9):
        for k in (2, 4, 8):
            synthetic_speculation(m, PROMPT, alpha=alpha, k=k, max_new_tokens=16)  # warm-up
            r = synthetic_speculation(m, PROMPT, alpha=alpha, k=k, max_new_tokens=128, seed=1)
            tau = (1 - alpha ** (k + 1)) / (1 - alpha)
            cost = relative.get(str(k + 1), relative.get(k + 1, float("nan")))
            rows.append({"alpha": alpha, "k": k, "speedup": t_plain / r.time_s,
                         "predicted": tau / cost, "tau": r.stats.mean_accepted_tokens,
                         "tau_expected": tau, "verify_cost": cost})
    return {"plain_s": t_plain, "rows": rows}


def part_equality() -> dict:
    import specdec

    shape = dict(specdec.dummy.SHAPES["tiny"], hidden_size=256, ffn_size=512, head_dim=64,
                 n_heads=4, n_kv_heads=2, vocab_size=301, n_layers=3)
    out = {}
    for dtype in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k"):
        cpu = specdec.dummy_model(shape, dtype, seed=5, kv_dtype="f32")  # as the GPU's
        gpu = specdec.dummy_model(shape, dtype, device=DEVICE, seed=5)
        same = spec_same = 0
        for s in range(8):
            prompt = [(7 * s + 3 * i) % 301 for i in range(5 + s)]
            a = specdec.generate(cpu, prompt, max_new_tokens=32).tokens
            b = specdec.generate(gpu, prompt, max_new_tokens=32).tokens
            lk = specdec.generate(gpu, prompt * 2, max_new_tokens=32,
                                  speculator=specdec.PromptLookup(k=4, verify_slope=0)).tokens
            plain2 = specdec.generate(gpu, prompt * 2, max_new_tokens=32).tokens
            same += a == b
            spec_same += lk == plain2
        # quantized weights: the CPU rounds activations to 8 bits, the GPU does not, so only
        # the float types are expected to agree across devices
        out[dtype] = {"cpu_eq_cuda": same, "lookup_eq_plain": spec_same, "of": 8,
                      "cross_device_expected": dtype in ("f32", "f16", "bf16")}
    return out


PARTS = {"copy": part_copy, "decode": part_decode, "verify": part_verify,
         "equality": part_equality}


def run_part(name: str, arg: str, timeout: float, env: dict | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--part", name]
    if arg:
        cmd += ["--arg", arg]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout)[-3000:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t0
    return out


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_bench.json")
    ap.add_argument("--part", choices=list(PARTS) + ["synthetic"], help=argparse.SUPPRESS)
    ap.add_argument("--arg", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.part:
        res = part_synthetic(json.loads(a.arg)) if a.part == "synthetic" else PARTS[a.part]()
        print(json.dumps(res))
        return
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = "unknown"
    res["gpu"] = gpu
    budget = float(os.environ.get("GPU_BENCH_PART_TIMEOUT", "240"))

    skip = set(filter(None, os.environ.get("GPU_BENCH_SKIP", "").split(",")))

    def part(key: str, name: str, arg: str = "", env: dict | None = None) -> None:
        # each part's result is written as soon as it is known: a run cut short by its
        # caller's limit still leaves the parts before it
        if key in skip:
            res[key] = {"error": "skipped (GPU_BENCH_SKIP)"}
            return
        res[key] = run_part(name, arg, budget, env)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"[{time.strftime('%H:%M:%S')}] {key}: "
              + ("error" if "error" in res[key] else f"done in {res[key]['wall_s']:.0f} s"),
              flush=True)

    part("equality", "equality")  # correctness first
    part("copy", "copy")
    part("decode", "decode")
    part("verify", "verify")
    # the same two with BF16 matmuls on the tensor cores
    part("decode_mma", "decode", env={"SPECDEC_CUDA_MMA": "1"})
    part("verify_mma", "verify", env={"SPECDEC_CUDA_MMA": "1"})
    # the same two for a quantized model (Q4_K, the common GGUF type; decoded in registers)
    part("decode_q4k", "decode", env={"GPU_BENCH_DTYPE": "q4_k"})
    part("verify_q4k", "verify", env={"GPU_BENCH_DTYPE": "q4_k"})
    # the matmuls with their activations never staged in shared memory (the default stages
    # them for quantized rows, and for float rows from 2 tokens)
    part("verify_unstaged", "verify", env={"SPECDEC_CUDA_STAGE": "0"})
    part("verify_q4k_unstaged", "verify",
         env={"GPU_BENCH_DTYPE": "q4_k", "SPECDEC_CUDA_STAGE": "0"})
    rel = res["verify"].get("relative", {})
    if rel:
        part("synthetic", "synthetic", json.dumps(rel))
    else:
        res["synthetic"] = {"error": "no verify curve"}

    print(f"\nGPU: {gpu}   (details: {a.out})")
    cp, dec = res["copy"], res["decode"]
    print("| what | value |\n|---|---|")
    print(f"| (a) device copy bandwidth | {fmt(cp.get('GBps'), '.0f')} GB/s |")
    if "forward_GBps" in dec:
        frac = dec["forward_GBps"] / cp["GBps"] if cp.get("GBps") else None
        print(f"| (b) 8B BF16 forward, 1 token | {dec['forward_s'] * 1e3:.2f} ms = "
              f"{dec['forward_GBps']:.0f} GB/s ({fmt(frac, '.0%')} of copy) |")
        print(f"| (b) 8B BF16 greedy decoding | {dec['tokens_per_s']:.1f} tok/s |")
    else:
        print(f"| (b) decode | error: {dec.get('error', '')[-300:]!r} |")
    if rel:
        print("| (c) verify T=2,4,8,16 / T=1 | " + ", ".join(
            f"{float(rel[str(T)] if str(T) in rel else rel[T]):.2f}" for T in (2, 4, 8, 16))
            + " |")
    else:
        print(f"| (c) verify | error: {res['verify'].get('error', '')[-300:]!r} |")
    for tag, what, key in (("mma", "BF16, tensor cores", "mma"), ("q4_k", "Q4_K", "q4k")):
        d, v = res["decode_" + key], res["verify_" + key].get("relative", {})
        if "forward_GBps" in d:
            frac = d["forward_GBps"] / cp["GBps"] if cp.get("GBps") else None
            print(f"| (b, {tag}) 8B {what} forward, 1 token | {d['forward_s'] * 1e3:.2f} ms = "
                  f"{d['forward_GBps']:.0f} GB/s ({fmt(frac, '.0%')} of copy); "
                  f"{d['tokens_per_s']:.1f} tok/s |")
        else:
            print(f"| (b, {tag}) | error: {d.get('error', '')[-300:]!r} |")
        if v:
            print(f"| (c, {tag}) verify T=2,4,8,16 / T=1 | " + ", ".join(
                f"{float(v[str(T)]):.2f}" for T in (2, 4, 8, 16)) + " |")
    for key, what in (("verify", "BF16"), ("verify_unstaged", "BF16, SPECDEC_CUDA_STAGE=0"),
                      ("verify_q4k", "Q4_K"), ("verify_q4k_unstaged", "Q4_K, SPECDEC_CUDA_STAGE=0")):
        vs = res[key].get("seconds", {})
        if vs:
            print(f"| (c, {what}) T=1 ms; T=2,4,8,16 / T=1 | "
                  f"{float(vs['1']) * 1e3:.2f}; " + ", ".join(
                      f"{float(vs[str(T)]) / float(vs['1']):.2f}" for T in (2, 4, 8, 16)) + " |")
    syn = res["synthetic"]
    if "rows" in syn:
        print("\n| alpha | K | speedup | predicted | tau (expected) |\n|---|---|---|---|---|")
        for r in syn["rows"]:
            print(f"| {r['alpha']} | {r['k']} | {r['speedup']:.2f}x | {r['predicted']:.2f}x | "
                  f"{r['tau']:.2f} ({r['tau_expected']:.2f}) |")
    else:
        print(f"(d) synthetic: error: {syn.get('error', '')[-300:]!r}")
    eq = res["equality"]
    if "error" not in eq:
        print("\n(e) tiny dummy models, 8 prompts of 32 greedy tokens: CPU == CUDA (float types; "
              "quantized ones differ by the CPU's 8-bit activations) / CUDA lookup == CUDA plain: "
              + ", ".join(f"{k} {v['cpu_eq_cuda']}/{v['lookup_eq_plain']}" for k, v in
                          eq.items() if isinstance(v, dict)))
    else:
        print(f"(e) equality: error: {eq['error'][-300:]!r}")


if __name__ == "__main__":
    main()
