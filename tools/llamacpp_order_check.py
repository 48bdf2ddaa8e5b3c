"""Check specdec's forward in llama.cpp's float order (Model.llamacpp_logits) against a live
llama.cpp on prompts of your choice, beyond the committed fixture's ten.

Needs llama-cpp-python (it compiles llama.cpp; never a dependency of specdec, its tests or CI):

    pip install llama-cpp-python
    python tools/llamacpp_order_check.py --model "$SPECDEC_SMOLLM2_GGUF" \\
        --data spec_bench_dev.jsonl --limit 12 --greedy 16

For each prompt (the first turn of each question, with the model's chat template), llama.cpp
evaluates the prompt in one batch and then --greedy tokens one at a time, keeping all logits;
specdec computes the same rows with llamacpp_logits(tokens, n_batch=len(prompt)). Prints, per
prompt, how many of the rows' logits are bit-identical and the largest difference. llama.cpp
splits prompts longer than its n_batch (512, the binding's default) into batches of 512; the rows
are the same as long as no batch is a single token, which this script avoids.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the GGUF file")
    ap.add_argument("--data", required=True, help="a Spec-Bench-format jsonl")
    ap.add_argument("--limit", type=int, default=12, help="questions to run (spread over the file)")
    ap.add_argument("--greedy", type=int, default=16, help="greedy tokens after each prompt")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import llama_cpp

    import specdec

    model = specdec.load(args.model, threads=args.threads)
    tok = model.require_tokenizer()
    rows = [json.loads(line) for line in open(args.data, encoding="utf-8") if line.strip()]
    step = max(1, len(rows) // max(1, args.limit))
    picked = rows[::step][:args.limit]
    llm = llama_cpp.Llama(args.model, n_ctx=2048, n_threads=args.threads, logits_all=True,
                          verbose=False)
    total_rows = total_equal = 0
    for q in picked:
        prompt = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}],
                                         add_generation_prompt=True)
        ids = tok.encode(prompt)
        if len(ids) % 512 == 1 or len(ids) + args.greedy > 2048:
            continue  # a one-token llama.cpp batch, or too long for the context
        llm.reset()
        llm.eval(ids)
        for _ in range(args.greedy):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([nxt])
        seq = [int(t) for t in llm.input_ids[:llm.n_tokens]]
        ref = np.array(llm.scores[:llm.n_tokens], dtype=np.float32)
        t0 = time.time()
        ours = model.llamacpp_logits(seq, n_batch=len(ids))
        dt = time.time() - t0
        equal = int(np.sum(np.all(ours == ref, axis=1)))
        total_rows += len(seq)
        total_equal += equal
        print(f"{q.get('category', '?'):>20s}  {len(ids):4d}+{args.greedy} tokens  rows equal "
              f"{equal}/{len(seq)}  max |diff| {float(np.abs(ours - ref).max()):.3g}  "
              f"({dt:.1f} s)", flush=True)
    print(f"all: {total_equal}/{total_rows} rows bit-identical")
    return 0 if total_equal == total_rows else 1


if __name__ == "__main__":
    sys.exit(main())
