"""What streaming costs on top of generate: stream() of N new tokens (every piece consumed)
against generate() of the same N tokens, greedy, no stop tokens, as time ratios: wall time,
and the CPU time of the process (all threads), which other load on the machine disturbs less.

Two models:
  * tiny: a dummy model of the "tiny" shape (2 layers, width 64) with SmolLM2's vocabulary of
    49,152 tokens and SmolLM2's tokenizer attached, so the forward costs little and the text
    handling is most of what stream() adds (without SmolLM2 at hand: a byte-level BPE trained
    here, of the same vocabulary size at most);
  * smollm2: SmolLM2-135M-Instruct itself, when it can be had (cache or download).
Also shown: the decoding work of the former stream(), which decoded the whole output again at
every token (Tokenizer.decode of every prefix), to show what the linear decoder removed.

    python benchmarks/bench_stream.py                    # 2,000 tokens, tiny and smollm2
    python benchmarks/bench_stream.py --tokens 500 --models tiny --repeats 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from typing import Callable, List, Tuple

import specdec
from specdec import hub
from specdec.tokenizer import Tokenizer


def trained_tokenizer() -> Tokenizer:
    """A byte-level BPE trained on a little English, saved as tokenizer.json and read back."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = ["The quick brown fox jumps over the lazy dog; caf\u00e9, na\u00efve, \u4f60\u597d."
            f" Line {i}: it's {i * 7} o'clock, isn't it?" for i in range(2000)]
    bpe.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=2000, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    with tempfile.TemporaryDirectory() as d:
        bpe.save(f"{d}/tokenizer.json")
        tok = Tokenizer.from_hf_dir(d)
    assert tok is not None
    return tok


def tiny_model(tok: Tokenizer, n_tokens: int, threads: int) -> specdec.Model:
    """The dummy "tiny" shape over tok's vocabulary, with tok attached as its tokenizer."""
    m = specdec.dummy_model("tiny", "f32", seed=3, vocab_size=tok.vocab_size,
                            context_length=n_tokens + 64, threads=threads)
    m._tokenizer, m._tokenizer_loaded = tok, True  # a dummy model has no file to read one from
    return m


def timed(fn: Callable[[], object]) -> Tuple[float, float]:
    """(wall seconds, CPU seconds of this process: all its threads) of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def bench(name: str, m: specdec.Model, prompt: List[int], n: int, repeats: int) -> None:
    """One table row: medians over `repeats` pairs of runs, each pair in alternating order."""
    kw = dict(max_new_tokens=n, stop_tokens=[])
    want = specdec.generate(m, prompt, **kw)  # warm up; the reference output
    pieces = list(specdec.stream(m, prompt, **kw))
    assert len(want.tokens) == n and "".join(pieces) == want.text, "stream != generate"
    gen, st = [], []
    for r in range(repeats):  # pairs in alternating order, so that drifting noise cancels
        if r % 2:
            st.append(timed(lambda: "".join(specdec.stream(m, prompt, **kw))))
        gen.append(timed(lambda: specdec.generate(m, prompt, **kw)))
        if not r % 2:
            st.append(timed(lambda: "".join(specdec.stream(m, prompt, **kw))))
    tok = m.tokenizer
    redecode = timed(lambda: [tok.decode(want.tokens[:i + 1]) for i in range(n)])[1]

    def med(xs: List[float]) -> float:
        return statistics.median(xs) * 1e3

    wall = statistics.median(s[0] / g[0] for g, s in zip(gen, st))
    cpu = statistics.median(s[1] / g[1] for g, s in zip(gen, st))
    print(f"| {name} | {n} | {med([g[0] for g in gen]):.0f} / {med([g[1] for g in gen]):.0f} "
          f"| {med([s[0] for s in st]):.0f} / {med([s[1] for s in st]):.0f} "
          f"| {wall:.3f} / {cpu:.3f} | {len(pieces)} | {redecode * 1e3:.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2000, help="new tokens per run")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each (median)")
    ap.add_argument("--models", default="tiny,smollm2", help="comma list: tiny, smollm2")
    ap.add_argument("--threads", default="1,2", help="comma list of thread counts")
    args = ap.parse_args()
    names = args.models.split(",")
    try:
        real = specdec.load(hub.resolve(hub.DEFAULT_MODEL))
    except OSError as e:
        print(f"SmolLM2 is not available ({e}): the tiny model gets a trained tokenizer")
        real = None
    print(f"# {platform.processor() or platform.machine()}, specdec kernels: "
          f"{specdec._core.simd_name()}, {args.repeats} repeats (median)")
    print("| model | new tokens | generate ms (wall / CPU) | stream ms (wall / CPU) "
          "| stream / generate (wall / CPU, median of pairs) | pieces "
          "| re-decoding every prefix, CPU ms |")
    print("|---|---|---|---|---|---|---|")
    for threads in (int(t) for t in args.threads.split(",")):
        if "tiny" in names:
            tok = real.tokenizer if real is not None else trained_tokenizer()
            prompt = tok.encode("Once upon a time, there was a little robot who")
            name = "tiny (SmolLM2 vocabulary)" if real is not None else "tiny (trained BPE)"
            m = tiny_model(tok, args.tokens + len(prompt), threads)
            bench(f"{name}, {threads} thread(s)", m, prompt, args.tokens, args.repeats)
        if "smollm2" in names and real is not None:
            m = specdec.load(real.path, threads=threads)
            prompt = m.tokenizer.encode(m.tokenizer.apply_chat_template(
                [{"role": "user", "content": "Write a long story about a robot."}]))
            bench(f"SmolLM2-135M-Instruct, {threads} thread(s)", m, prompt, args.tokens,
                  max(2, args.repeats // 2))


if __name__ == "__main__":
    main()
