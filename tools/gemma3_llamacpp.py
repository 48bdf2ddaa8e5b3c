"""Gemma-3-270M (GGUF Q4_K_M, the "gemma-3-270m" alias) in specdec against llama.cpp.

Records llama.cpp's view of the file as a test fixture (tests/fixtures/gemma3_llamacpp.json,
read by tests/test_families_gemma3.py, which never imports llama_cpp) and prints how specdec
compares:

* tokenization: llama.cpp's ``tokenize(text, add_bos=True, special=True)`` against specdec's
  ``tokenizer.encode(text, add_special=True)``, for every prompt;
* teacher-forced top-1 agreement: each prompt is followed by 64 tokens of llama.cpp's greedy
  continuation (an argmax loop over ``eval([tok])``, no sampler), and the whole sequence is
  scored in one batch by llama.cpp (``logits_all=True``) and by specdec (``Model.logits``); the
  share of positions where the two argmaxes agree is set against llama.cpp's agreement with
  itself: the same sequence evaluated one token at a time (its one-token kernel path).

The last prompt is all the others joined (241 tokens; 304 with its continuation, within the
model's 512-token sliding window: tools/check_gemma3_gguf.py checks 600 tokens against
transformers).

    python tools/gemma3_llamacpp.py [--model PATH] [--out tests/fixtures/gemma3_llamacpp.json]

Needs llama-cpp-python (never a dependency of specdec or its tests). The prompts were written
for this script. llama.cpp runs with n_ctx 1024, 2 threads and its default (f16) KV cache;
specdec with its default (f16) KV cache, and again with an f32 one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import specdec  # noqa: E402

N_GREEDY, N_TOP, N_CTX, THREADS = 64, 5, 1024, 2

PROMPTS = [
    ("prose", "The lighthouse keeper wrote in his log every evening. On the night of the storm "
              "he noted that the waves had reached the second window, and that"),
    ("facts", "Water boils at 100 degrees Celsius at sea level. At the top of a high mountain "
              "it boils at a lower temperature because"),
    ("code", "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
             "    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
             "    out = []\n    i = j = 0\n"),
    ("numbers", "Order #48213 shipped on 2024-03-17: 3 boxes at 12.50 EUR, 1 crate at 249.99 "
                "EUR. Total before tax:"),
    ("list", "Things to pack for a week of hiking:\n1. A tent\n2. A sleeping bag\n3."),
    ("multilingual", "Bonjour, je m'appelle Claire et j'habite \u00e0 Lyon. Guten Tag! "
                     "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\u3002 In English, these "
                     "greetings mean"),
    ("whitespace", "Name:\t\tAge\n  Alice\t\t31\n  Bob\t\t27\n\n\nThe table above shows   "
                   "two people; the older one is"),
]


def top_pairs(row: np.ndarray, n: int) -> list:
    idx = np.lexsort((np.arange(row.size), -row))[:n]  # largest first, ties to the lower id
    return [[int(i), round(float(row[i]), 5)] for i in idx]


def llamacpp_record(path: str) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=N_CTX, n_threads=THREADS, n_threads_batch=THREADS,
                n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True, verbose=False)
    prompts = PROMPTS + [("joined", "\n\n".join(t for _, t in PROMPTS))]
    out = []
    for name, text in prompts:
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(tokens)
        greedy = []
        for _ in range(N_GREEDY):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            greedy.append(tok)
            llm.eval([tok])
        seq = tokens + greedy[:-1]
        llm.reset()
        llm.eval(seq)  # one batch
        batched = np.array(llm.scores[:len(seq)], dtype=np.float32)
        llm.reset()
        for t in seq:  # one token at a time
            llm.eval([t])
        stepwise = np.array(llm.scores[:len(seq)], dtype=np.float32)
        out.append({
            "name": name, "text": text, "tokens": tokens, "greedy": greedy,
            "top": [top_pairs(r, N_TOP) for r in batched],
            "top1_stepwise": [int(i) for i in stepwise.argmax(axis=1)],
        })
        print(f"{name}: {len(tokens)} prompt tokens", file=sys.stderr)
    return {"llama_cpp_python": llama_cpp.__version__, "prompts": out}


def compare(path: str, rec: dict) -> dict:
    res = {}
    for kv in ("f16", "f32"):
        m = specdec.load(path, kv_dtype=kv, threads=THREADS)
        tok_ok = all(m.tokenizer.encode(p["text"], add_special=True) == p["tokens"]
                     for p in rec["prompts"])
        agree = self_agree = total = 0
        for p in rec["prompts"]:
            seq = p["tokens"] + p["greedy"][:-1]
            ours = m.logits(seq).argmax(axis=1)
            ref = np.array([t[0][0] for t in p["top"]])
            agree += int(np.sum(ours == ref))
            self_agree += int(np.sum(np.array(p["top1_stepwise"]) == ref))
            total += len(seq)
        res[kv] = {"tokenization_identical": tok_ok, "positions": total,
                   "specdec_vs_llamacpp_top1": agree / total,
                   "llamacpp_stepwise_vs_batched_top1": self_agree / total}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="the GGUF (default: the gemma-3-270m alias)")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures"
                    / "gemma3_llamacpp.json")
    a = ap.parse_args()
    path = a.model or specdec.hub.resolve("gemma-3-270m")
    rec = llamacpp_record(path)
    rec = {"about": "tools/gemma3_llamacpp.py: llama.cpp's tokens, greedy continuations, "
                    "batched top-5 logits and one-token top-1 of Gemma-3-270M Q4_K_M",
           "model": Path(path).name, "model_sha256": specdec.hub.sha256_of(path),
           "date": datetime.date.today().isoformat(), "n_ctx": N_CTX, "threads": THREADS,
           **rec}
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                      for k, v in rec.items() if k != "prompts")
    prompts = ",\n".join("  " + json.dumps(p, ensure_ascii=False) for p in rec["prompts"])
    a.out.write_text("{\n" + body + ',\n "prompts": [\n' + prompts + "\n ]\n}\n")
    print(json.dumps(compare(path, rec), indent=1))


if __name__ == "__main__":
    main()
