"""specdec against llama.cpp (llama-cpp-python) on the same GGUF, same threads, same work.

Recommended command (NumPy's idle OpenBLAS threads otherwise spin on a 2-core machine; the
script also sets OPENBLAS_NUM_THREADS=1 itself unless it is already set):

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_vs_llamacpp.py \\
        --model "$SPECDEC_SMOLLM2_GGUF" --threads 1,2 --repeats 5 --json out.json

Needs `pip install llama-cpp-python` (a benchmark-only peer; never a dependency of specdec, its
tests or CI). Run it from the repository root with the extension built in place
(PYTHONPATH=. if needed) or with specdec installed. If specdec cannot load the model (e.g. its
quantized kernels are missing: ValueError "... has type Q8_0, which specdec cannot compute with
yet"), specdec's columns read "n/a" and the reason is printed; the llama.cpp half still runs.

What is timed (time.perf_counter around exactly this, nothing else), per engine and thread
count, after one untimed warm-up of each; every measurement is repeated --repeats times,
engines interleaved (specdec, llama.cpp, then llama.cpp, specdec in the next repeat, ...),
thread counts interleaved within a repeat; the table shows medians:

* prefill: one forward over --prefill (512) fixed synthetic token ids (a deterministic
  sequence of ordinary vocabulary ids, no specials), positions 0..511, logits of the last
  token only, into an empty cache.
    specdec:   cache = model.new_cache(prefill + 88)   [untimed]
               model.forward(cache, tokens, n_logits=1)
    llama.cpp: llm.reset()                              [untimed]
               llm.eval(tokens)      (n_batch = n_ubatch = 512: one batch; logits_all=False,
                                      so llama.cpp computes the output head for the last row only)
  prefill tok/s = 512 / seconds.
* decode: after an untimed prefill of a --decode-prompt (16) token synthetic prompt and an
  untimed argmax of its last logits, --decode (256) steps of
    specdec:   logits = model.forward(cache, [tok], n_logits=1); tok = int(np.argmax(logits[0]))
    llama.cpp: llm.eval([tok]); tok = int(np.argmax(<last logits row, zero-copy view of
               llama_get_logits_ith(ctx, -1)>))
  i.e. greedy decoding by our own argmax on both sides (not llama.cpp's sampler chain and not
  specdec.generate, whose time includes prefill). decode tok/s = 256 / seconds. When both
  engines run, the number of identical leading greedy tokens is reported (a sanity check: a
  quantized forward that matches llama.cpp's should agree for most of them).
* verify-batch cost curve: after an untimed --verify-context (64) token prefix, one forward over
  T = 1..16 tokens with logits for all T rows (what a speculative verify step needs), averaged
  over --verify-inner calls, reported relative to T = 1.
    specdec:   cache.rollback(64); model.forward(cache, toks)            (all T rows)
    llama.cpp: llm.n_tokens = 64; llm.eval(toks)   on a second Llama with logits_all=True (eval
               removes the KV entries from position 64 on; its time includes llama-cpp-python
               copying the T rows of logits into llm.scores)

llama.cpp settings: Llama(path, n_ctx, n_batch=512, n_ubatch=512, n_threads=t,
n_threads_batch=t, verbose=False); llama-cpp-python's defaults otherwise (F16 KV cache, flash
attention off unless --flash-attn). One Llama per thread count (and one more with
logits_all=True for the verify curve); specdec: one model, model.threads = t before each run.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads OpenBLAS

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

VERIFY_SIZES = list(range(1, 17))


def synthetic_tokens(n: int, salt: int = 0, vocab: int = 49152):
    """A deterministic sequence of ordinary token ids (well clear of the control tokens)."""
    lo, span = 100, min(vocab, 49152) - 200
    return [lo + (7919 * i + 104729 * salt + 3571) % span for i in range(n)]


def cpu_info() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"cpu": model, "cpu_count": os.cpu_count(), "usable_cpus": usable,
            "platform": platform.platform()}


# ----------------------------------------------------------------------------------- specdec
class SpecdecSide:
    name = "specdec"

    def __init__(self, path: str, threads: int):
        import specdec
        self.version = getattr(specdec, "__version__", "?")
        self.model = specdec.load(path, threads=threads)

    def set_threads(self, t: int) -> None:
        self.model.threads = t

    def prefill(self, tokens) -> float:
        cache = self.model.new_cache(len(tokens) + 88)
        t0 = time.perf_counter()
        self.model.forward(cache, tokens, n_logits=1)
        return time.perf_counter() - t0

    def decode(self, prompt, steps: int):
        m = self.model
        cache = m.new_cache(len(prompt) + steps + 8)
        tok = int(np.argmax(m.forward(cache, prompt, n_logits=1)[0]))
        out = [tok]
        t0 = time.perf_counter()
        for _ in range(steps):
            tok = int(np.argmax(m.forward(cache, [tok], n_logits=1)[0]))
            out.append(tok)
        return time.perf_counter() - t0, out

    def verify(self, prefix, sizes, inner: int) -> dict:
        m = self.model
        L = len(prefix)
        cache = m.new_cache(L + max(sizes) + 8)
        m.forward(cache, prefix, n_logits=1)
        res = {}
        for T in sizes:
            toks = synthetic_tokens(T, salt=T)
            cache.rollback(L)
            m.forward(cache, toks)  # warm-up for this shape
            t0 = time.perf_counter()
            for _ in range(inner):
                cache.rollback(L)
                m.forward(cache, toks)
            res[T] = (time.perf_counter() - t0) / inner
        return res


# --------------------------------------------------------------------------------- llama.cpp
class LlamaSide:
    name = "llama.cpp"

    def __init__(self, path: str, threads_list, n_ctx: int, verify_ctx: int, flash_attn: bool):
        import llama_cpp
        self.llama_cpp = llama_cpp
        self.version = llama_cpp.__version__
        self.path, self.flash_attn, self.verify_ctx = path, flash_attn, verify_ctx
        self.llms = {t: self._make(t, n_ctx, logits_all=False) for t in threads_list}
        self.vllms = {}
        self.t = threads_list[0]

    def _make(self, t: int, n_ctx: int, logits_all: bool):
        from llama_cpp import Llama
        return Llama(model_path=self.path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=t,
                     n_threads_batch=t, logits_all=logits_all, flash_attn=self.flash_attn,
                     verbose=False)

    def set_threads(self, t: int) -> None:
        self.t = t

    def _last_logits(self, llm) -> np.ndarray:
        ptr = self.llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(llm._n_vocab,))

    def prefill(self, tokens) -> float:
        llm = self.llms[self.t]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        return time.perf_counter() - t0

    def decode(self, prompt, steps: int):
        llm = self.llms[self.t]
        llm.reset()
        llm.eval(prompt)
        tok = int(np.argmax(self._last_logits(llm)))
        out = [tok]
        t0 = time.perf_counter()
        for _ in range(steps):
            llm.eval([tok])
            tok = int(np.argmax(self._last_logits(llm)))
            out.append(tok)
        return time.perf_counter() - t0, out

    def verify(self, prefix, sizes, inner: int) -> dict:
        if self.t not in self.vllms:
            self.vllms[self.t] = self._make(self.t, self.verify_ctx, logits_all=True)
        llm = self.vllms[self.t]
        L = len(prefix)
        llm.reset()
        llm.eval(prefix)
        res = {}
        for T in sizes:
            toks = synthetic_tokens(T, salt=T)
            llm.n_tokens = L
            llm.eval(toks)  # warm-up for this shape
            t0 = time.perf_counter()
            for _ in range(inner):
                llm.n_tokens = L  # eval() removes KV cells from position L on
                llm.eval(toks)
            res[T] = (time.perf_counter() - t0) / inner
        return res


# -------------------------------------------------------------------------------------- main
def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", default=os.environ.get("SPECDEC_SMOLLM2_GGUF"),
                   help="GGUF file (default: $SPECDEC_SMOLLM2_GGUF)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=5, help="runs per measurement (median)")
    p.add_argument("--prefill", type=int, default=512, help="prefill prompt tokens (<= 512)")
    p.add_argument("--decode", type=int, default=256, help="decode steps")
    p.add_argument("--decode-prompt", type=int, default=16, help="prompt tokens before decode")
    p.add_argument("--verify-context", type=int, default=64, help="prefix before verify batches")
    p.add_argument("--verify-inner", type=int, default=3, help="calls averaged per verify size")
    p.add_argument("--no-verify", action="store_true", help="skip the verify cost curve")
    p.add_argument("--flash-attn", action="store_true", help="llama.cpp: flash attention on")
    p.add_argument("--no-specdec", action="store_true", help="llama.cpp only")
    p.add_argument("--json", help="write the raw numbers (seconds) here")
    args = p.parse_args(argv)
    if not args.model:
        p.error("no model: pass --model or set SPECDEC_SMOLLM2_GGUF")
    if not os.path.isfile(args.model):
        p.error(f"no such file: {args.model}")
    if not 1 <= args.prefill <= 512:
        p.error("--prefill must be in 1..512 (one llama.cpp batch)")
    threads = [int(t) for t in args.threads.split(",")]
    sizes = [] if args.no_verify else VERIFY_SIZES
    command = (f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']} python "
               + " ".join(shlex.quote(a) for a in sys.argv))
    machine = cpu_info()

    try:
        llama = LlamaSide(args.model, threads,
                          n_ctx=max(args.prefill, args.decode_prompt + args.decode + 1) + 64,
                          verify_ctx=args.verify_context + max(VERIFY_SIZES) + 64,
                          flash_attn=args.flash_attn)
    except ImportError:
        sys.exit("llama_cpp is not installed: `pip install llama-cpp-python` (benchmark only)")
    spec, spec_reason = None, "skipped (--no-specdec)"
    if not args.no_specdec:
        try:
            spec = SpecdecSide(args.model, max(threads))
            spec_reason = None
        except ImportError as e:
            spec_reason = f"specdec not importable: {e}"
        except ValueError as e:  # e.g. quantized tensor types specdec cannot compute with yet
            spec_reason = f"specdec cannot load the model: {e}"
    if spec_reason:
        print(f"specdec: unavailable — {spec_reason}", file=sys.stderr)
    engines = [e for e in (spec, llama) if e is not None]

    prefill_toks = synthetic_tokens(args.prefill, salt=1)
    decode_prompt = synthetic_tokens(args.decode_prompt, salt=2)
    verify_prefix = synthetic_tokens(args.verify_context, salt=3)

    # Untimed warm-up of every engine and thread count: the first forward of a llama.cpp
    # context (and of specdec) pays page faults of the mapped weights, weight repacking and
    # buffer allocation, and would otherwise land in the first repeat.
    for t in threads:
        for e in engines:
            e.set_threads(t)
            e.prefill(prefill_toks)
            e.decode(decode_prompt, 8)
            if sizes:
                e.verify(verify_prefix, [1, max(sizes)], 1)

    raw = {e.name: {t: {"prefill": [], "decode": [], "verify": {T: [] for T in sizes}}
                    for t in threads} for e in engines}
    greedy = {e.name: {} for e in engines}
    for r in range(args.repeats):
        order = engines if r % 2 == 0 else engines[::-1]
        for t in threads:
            for e in order:
                e.set_threads(t)
                raw[e.name][t]["prefill"].append(e.prefill(prefill_toks))
            for e in order:
                e.set_threads(t)
                dt, toks = e.decode(decode_prompt, args.decode)
                raw[e.name][t]["decode"].append(dt)
                greedy[e.name][t] = toks
            if sizes:
                for e in order:
                    e.set_threads(t)
                    for T, s in e.verify(verify_prefix, sizes, args.verify_inner).items():
                        raw[e.name][t]["verify"][T].append(s)
        print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    med = statistics.median

    def rate(name, t, kind, n):
        if name not in raw:
            return None
        return n / med(raw[name][t][kind])

    print(f"\nModel: {os.path.basename(args.model)} ({os.path.getsize(args.model)} bytes)")
    print(f"Machine: {machine['cpu']}, {machine['cpu_count']} CPUs "
          f"({machine['usable_cpus']} usable), {machine['platform']}")
    print(f"llama-cpp-python {llama.version}; specdec "
          f"{spec.version if spec else 'n/a (' + spec_reason + ')'}")
    print(f"Command: {command}")
    print(f"Median of {args.repeats} runs, engines and thread counts interleaved. Prefill: "
          f"{args.prefill} tokens, last logits only. Decode: {args.decode} greedy one-token "
          f"forwards + argmax after a {args.decode_prompt}-token prompt.\n")
    print("| threads | phase | specdec tok/s | llama.cpp tok/s | specdec / llama.cpp |")
    print("|---|---|---|---|---|")
    summary = {}
    for t in threads:
        for kind, n in (("prefill", args.prefill), ("decode", args.decode)):
            s, l = rate("specdec", t, kind, n), rate("llama.cpp", t, kind, n)
            ratio = s / l if s is not None and l else None
            summary[f"{t}/{kind}"] = {"specdec_tok_s": s, "llamacpp_tok_s": l, "ratio": ratio}
            print(f"| {t} | {kind} {n} | {fmt(s)} | {fmt(l)} | {fmt(ratio, '.2f')} |")
    agree = {}
    if spec is not None:
        for t in threads:
            a, b = greedy["specdec"][t], greedy["llama.cpp"][t]
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            agree[t] = k
        print("\nGreedy agreement (identical leading tokens of "
              f"{args.decode + 1}): " + ", ".join(f"{t} thr: {k}" for t, k in agree.items()))

    if sizes:
        cols = [(e.name, t) for e in engines for t in threads]
        print(f"\nVerify-batch cost: one forward over T tokens (all T rows of logits) after a "
              f"{args.verify_context}-token prefix, relative to T = 1 "
              f"(mean of {args.verify_inner} calls, median of {args.repeats} runs)\n")
        print("| T | " + " | ".join(f"{n} {t} thr" for n, t in cols) + " |")
        print("|---|" + "---|" * len(cols))
        print("| T=1 ms | " + " | ".join(f"{1e3 * med(raw[n][t]['verify'][1]):.2f}"
                                         for n, t in cols) + " |")
        for T in sizes[1:]:
            print(f"| {T} | " + " | ".join(
                f"{med(raw[n][t]['verify'][T]) / med(raw[n][t]['verify'][1]):.2f}"
                for n, t in cols) + " |")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "model_bytes": os.path.getsize(args.model),
                       "machine": machine, "command": command,
                       "llama_cpp_python_version": llama.version,
                       "specdec_version": spec.version if spec else None,
                       "specdec_unavailable": spec_reason, "args": vars(args),
                       "summary": summary, "greedy_agreement": agree, "raw_seconds": raw},
                      f, indent=1)
        print(f"\nraw numbers: {args.json}")


if __name__ == "__main__":
    main()
