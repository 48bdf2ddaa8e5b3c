"""Record llama.cpp's view of SmolLM2-135M-Instruct (GGUF Q4_1) as a test fixture for specdec.

llama.cpp, through its Python bindings llama-cpp-python, is the yardstick specdec's quantized
forward pass is checked against. This script runs llama.cpp once over a handful of prompts and
writes what it saw to a JSON file that the tests read; the tests never import llama_cpp.

Needs (on the machine that regenerates the fixture only; it is NOT a dependency of specdec, its
tests or CI, and this script installs nothing):

    pip install llama-cpp-python jinja2 numpy

Rerun:

    python tools/llamacpp_reference.py --model "$SPECDEC_SMOLLM2_GGUF" \\
        --out tests/fixtures/smollm2_llamacpp.json

What is recorded. The model is loaded with
``llama_cpp.Llama(path, n_ctx=2048, n_threads=2, logits_all=True, verbose=False)``. For each
prompt (written for this file, not taken from any data set):

* ``text``: the exact prompt string. Chat prompts (``chat: true``) are rendered from a list of
  messages with the model's own chat template (``tokenizer.chat_template`` in the GGUF metadata,
  ChatML, which inserts the default system turn "You are a helpful AI assistant named SmolLM,
  trained by Hugging Face" when there is no system message) via jinja2, the way Hugging Face
  transformers renders it (sandboxed, trim_blocks, lstrip_blocks), with the generation prompt
  ``<|im_start|>assistant\\n`` appended; ``messages`` keeps the messages.
* ``tokens``: ``llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)``, i.e. control
  tokens written in the text (``<|im_start|>`` = 1, ``<|im_end|>`` = 2) become their ids, and no
  BOS is added.
* ``top_logits``: one ``llm.eval(tokens)`` over the whole prompt (a single batch, positions
  0..n-1, logits of every row); for every position t, the 20 largest logits of the row after
  token t as ``[token_id, logit]`` pairs, largest first (ties: lower id first), logits rounded to
  5 decimals.
* ``top_logits_stepwise``: the same prompt evaluated one token at a time (llama.cpp's one-token
  kernel path), the logits of the same 20 ids: llama.cpp's own spread between two of its
  arithmetic paths, from which the parity tests derive their tolerance.
* ``greedy``: 64 tokens of greedy continuation from that state, by an argmax loop over
  ``llm.eval([tok])`` and ``llm.scores`` (no sampler, so no repeat penalty; exact ties go to the
  lowest id; end-of-generation tokens do not stop it: the raw 64 ids are recorded), and
  ``greedy_margin``: for each step, best logit minus second-best logit (0.0 on an exact tie),
  rounded to 5 decimals, so that a test can tell near-ties apart from real disagreements.

Top level: the model file's name, sha256 and size, the llama-cpp-python version, n_top, n_ctx,
the date, this command and ``notes`` (NOTES below). Compact JSON, one prompt per line.

How close to expect another implementation to be (measured when the fixture was made; see
NOTES): llama.cpp quantizes activations to 8 bits before its integer dot products, and this
small model amplifies such rounding, so logits are reproducible only to about 0.2 on average
(max about 2) between implementations, and even between llama.cpp's own batched and one-token
evaluations. Compare argmax where the recorded top-1/top-2 gap is large, teacher-forced (feed
``tokens + greedy`` in one forward), rather than free-running continuations, which part at the
first near-tie.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import sys

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests",
                           "fixtures", "smollm2_llamacpp.json")
N_CTX = 2048
N_THREADS = 2
N_TOP = 20
N_GREEDY = 64

NOTES = (
    "Tolerances measured with llama-cpp-python 0.3.36 on this model: llama.cpp's logits depend "
    "on its batching (bit-identical for any ubatch of >= 2 tokens, but evaluating the prompts "
    "one token at a time moves them by up to ~2.1, mean ~0.15-0.25, and flips ~3% of argmaxes). "
    "An exact float64 forward over the dequantized weights (no activation quantization) differs "
    "from top_logits by mean ~0.2, max ~1.3, agrees with the argmax at every prompt position "
    "whose recorded top-1/top-2 gap exceeds 1.0 (and at 87-100% of all positions), and, "
    "teacher-forced on tokens+greedy, disagrees with greedy only at steps with greedy_margin "
    "<= 0.36. Free-running greedy continuations of two correct implementations can part at the "
    "first near-tie (step 0 for some prompts): compare teacher-forced, where the margin is large.")

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Prompts written for this fixture. Chat prompts are message lists, the others plain strings.
PROMPTS = [
    ("chat_default_system", [
        {"role": "user", "content": "Why do onions make people cry when they are chopped?"},
    ]),
    ("chat_own_system", [
        {"role": "system", "content": "You answer in exactly one short sentence."},
        {"role": "user", "content": "How many legs does a spider have?"},
    ]),
    ("chat_multi_turn", [
        {"role": "user", "content": "Suggest a name for a small grey kitten."},
        {"role": "assistant", "content": "How about Pebble?"},
        {"role": "user", "content": "Nice! Give me two more in the same style."},
    ]),
    ("chat_code_request", [
        {"role": "user", "content": "Write a Python function is_palindrome(s) that ignores "
                                    "case and spaces."},
    ]),
    ("chat_whitespace_emoji", [
        {"role": "user", "content": "  Translate 'good morning' into French, Japanese and "
                                    "Spanish 🌅\n\n"},
    ]),
    ("plain_prose",
     "The lighthouse keeper climbed the spiral staircase each evening, counting the worn stone "
     "steps while the fog rolled slowly in from the harbour."),
    ("code",
     "def fib(n: int) -> list[int]:\n"
     "    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n"
     "    a, b = 0, 1\n"
     "    out = []\n"
     "    for _ in range(n):\n"
     "        out.append(a)\n"
     "        a, b = b, a + b\n"
     "    return out\n"
     "\n"
     "print(fib(10))  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n"),
    ("numbers",
     "Order #20481977 shipped on 2025-03-14 at 09:26:53; weight 1234567.891 kg, price "
     "$98,765,432.10, serial 3141592653589793238462643383279."),
    ("unicode",
     "Café crème brûlée, naïve façade, Zürich — 東京の天気は晴れです。 Привет, мир! "
     "🚀🎉👩‍💻 ½ ≠ ∞ …"),
    ("whitespace",
     "   three leading spaces,  two  spaces  between words,\n\n\nthree newlines,\ttab, and "
     "trailing spaces   \n\n"),
]


def render_chat(template: str, messages, bos_token: str = "", eos_token: str = "") -> str:
    """Render ``messages`` with a Hugging Face style jinja2 chat template, generation prompt on."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos_token, eos_token=eos_token)


def chatml_by_hand(messages) -> str:
    """The ChatML string SmolLM2's template is expected to produce (a cross-check)."""
    out = ""
    if messages[0]["role"] != "system":
        out += f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def top_pairs(row, n_top: int):
    """The n_top largest entries of a logits row as [id, logit] (desc; ties: lower id first)."""
    import numpy as np

    row = np.asarray(row, dtype=np.float32)
    # Candidates: everything >= the n_top-th largest value (so ties at the boundary are kept).
    kth = np.partition(row, -n_top)[-n_top]
    cand = np.nonzero(row >= kth)[0]
    order = np.lexsort((cand, -row[cand]))[:n_top]
    return [[int(cand[i]), round(float(row[cand[i]]), 5)] for i in order]


def greedy_step(row):
    """(argmax with lowest id on ties, best - second best)."""
    import numpy as np

    row = np.asarray(row, dtype=np.float32)
    best = int(np.argmax(row))  # first maximal index = lowest id
    second = np.partition(row, -2)[-2]
    return best, round(float(row[best]) - float(second), 5)


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record(model_path: str, n_top: int = N_TOP, n_greedy: int = N_GREEDY, quiet=False) -> dict:
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=model_path, n_ctx=N_CTX, n_threads=N_THREADS, logits_all=True,
                verbose=False)
    template = llm.metadata["tokenizer.chat_template"]
    vocab = llm.n_vocab()

    prompts = []
    for name, spec in PROMPTS:
        chat = not isinstance(spec, str)
        if chat:
            text = render_chat(template, spec)
            if text != chatml_by_hand(spec):
                raise RuntimeError(f"{name}: the GGUF chat template rendered\n{text!r}\nwhich "
                                   f"differs from plain ChatML\n{chatml_by_hand(spec)!r}")
        else:
            text = spec
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        n = len(tokens)
        if n + n_greedy > N_CTX:
            raise RuntimeError(f"{name}: {n} tokens + {n_greedy} do not fit n_ctx={N_CTX}")

        llm.reset()
        llm.eval(tokens)  # one batch (n < n_batch=512): logits of every row
        scores = np.array(llm.scores[:n], dtype=np.float32)  # copy: greedy overwrites later rows
        assert scores.shape == (n, vocab)
        top = [top_pairs(scores[t], n_top) for t in range(n)]

        # llama.cpp's own spread: the same prompt evaluated one token at a time (another kernel
        # path) gives other logits for the same ids; tests derive their tolerance from this
        llm.reset()
        stepwise = []
        for t in range(n):
            llm.eval([tokens[t]])
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            stepwise.append([round(float(row[i]), 5) for i, _ in top[t]])
        llm.reset()
        llm.eval(tokens)

        greedy, margin = [], []
        row = scores[n - 1]
        for step in range(n_greedy):
            tok, gap = greedy_step(row)
            greedy.append(tok)
            margin.append(gap)
            if step + 1 < n_greedy:
                llm.eval([tok])
                row = llm.scores[llm.n_tokens - 1]

        entry = {"name": name, "text": text, "chat": chat}
        if chat:
            entry["messages"] = spec
        entry.update(tokens=[int(t) for t in tokens], top_logits=top,
                     top_logits_stepwise=stepwise, greedy=greedy, greedy_margin=margin)
        prompts.append(entry)
        if not quiet:
            cont = llm.detokenize(greedy, special=True).decode("utf-8", errors="replace")
            roundtrip = llm.detokenize(tokens, special=True).decode("utf-8", "replace") == text
            print(f"{name:24s} {n:4d} tokens  detokenize==text: {roundtrip}  "
                  f"min greedy margin {min(margin):.4f}\n    -> {cont[:150]!r}", file=sys.stderr)

    return {
        "model": os.path.basename(model_path),
        "model_sha256": sha256_of(model_path),
        "model_bytes": os.path.getsize(model_path),
        "llama_cpp_python_version": llama_cpp.__version__,
        "n_top": n_top,
        "n_ctx": N_CTX,
        "n_threads": N_THREADS,
        "n_greedy": n_greedy,
        "date": datetime.date.today().isoformat(),
        "command": "pip install llama-cpp-python && python tools/llamacpp_reference.py "
                   "--model \"$SPECDEC_SMOLLM2_GGUF\" --out tests/fixtures/smollm2_llamacpp.json",
        "notes": NOTES,
        "prompts": prompts,
    }


def dump(data: dict, path: str) -> None:
    """Compact JSON: one top-level field per line, one prompt per line."""
    def c(x):
        return json.dumps(x, ensure_ascii=False, separators=(",", ":"))

    head = [f"{c(k)}:{c(v)}" for k, v in data.items() if k != "prompts"]
    lines = ["{"] + [h + "," for h in head] + ['"prompts":[']
    lines += [c(p) + ("," if i + 1 < len(data["prompts"]) else "")
              for i, p in enumerate(data["prompts"])]
    lines += ["]}"]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description="Record llama.cpp logits/greedy continuations of SmolLM2-135M-Instruct as a "
                    "specdec test fixture. Needs `pip install llama-cpp-python` (not a specdec "
                    "dependency).",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default=os.environ.get("SPECDEC_SMOLLM2_GGUF"),
                   help="SmolLM2-135M-Instruct GGUF (default: $SPECDEC_SMOLLM2_GGUF)")
    p.add_argument("--out", default=os.path.normpath(DEFAULT_OUT),
                   help="output JSON (default: tests/fixtures/smollm2_llamacpp.json)")
    p.add_argument("--quiet", action="store_true", help="no per-prompt summary on stderr")
    args = p.parse_args(argv)
    if not args.model:
        p.error("no model: pass --model or set SPECDEC_SMOLLM2_GGUF")
    if not os.path.isfile(args.model):
        p.error(f"no such file: {args.model}")
    if importlib.util.find_spec("llama_cpp") is None:
        sys.exit("llama_cpp is not installed: `pip install llama-cpp-python` (only needed to "
                 "regenerate the fixture)")
    data = record(args.model, quiet=args.quiet)
    dump(data, args.out)
    n_tok = sum(len(q["tokens"]) for q in data["prompts"])
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(data['prompts'])} prompts, "
          f"{n_tok} prompt tokens, llama-cpp-python {data['llama_cpp_python_version']}")


if __name__ == "__main__":
    main()
