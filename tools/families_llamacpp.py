"""llama.cpp itself on the family fixtures whose GGUF llama.cpp's converter wrote
(tests/fixtures/families/NAME.gguf): its logits against transformers' (the fixture's) and
specdec's, for phi3_longrope (partial rotary embeddings and LongRoPE), smollm3 (NoPE layers),
qwen2_yarn (YaRN) and granite (its multipliers).

The fixtures' vocabularies are placeholders without merges, which llama.cpp's loader refuses, so
a copy is written with a SentencePiece-style vocabulary of the same size (the tokenizer plays no
part in the logits) and without general.name (llama.cpp gives a model named "phi3" token
attributes by name). llama.cpp pads its context to a multiple of 256, above phi3_longrope's
original context of 16, so it runs the long factors there: compared with the fixture's
"logits" and with specdec loaded with context_length=64. Both use f16 KV caches here.

Needs llama-cpp-python and the gguf-py of llama.cpp's source (the llama-cpp-python sdist
carries it under vendor/llama.cpp/gguf-py); the test suite does not use this script.

    python tools/families_llamacpp.py --gguf-py LLAMA_CPP_SOURCE_DIR/gguf-py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "families"
# specdec.load's arguments for each case
CASES = {"phi3_longrope": {"context_length": 64}, "smollm3": {}, "qwen2_yarn": {},
         "granite": {}}


def retokenized_copy(gguf, src: Path, dst: Path, add_vocab) -> None:
    """src without its tokenizer keys and general.name (llama.cpp gives a model named "phi3"
    token attributes by name), add_vocab(writer, n_vocab) writing the vocabulary instead."""
    r = gguf.GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(dst), arch=arch)
    skip = ("general.architecture", "general.name")
    for f in r.fields.values():
        if f.name.startswith(("GGUF.", "tokenizer.")) or f.name in skip:
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            vals = ([bytes(f.parts[i]).decode() for i in f.data]
                    if sub == gguf.GGUFValueType.STRING else [f.parts[i].tolist()[0] for i in f.data])
            w.add_key_value(f.name, vals, t, sub_type=sub)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[-1]).decode(), t)
        else:
            w.add_key_value(f.name, f.parts[-1].tolist()[0], t)
    add_vocab(w, next(t for t in r.tensors if t.name == "token_embd.weight").shape.tolist()[-1])
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sentencepiece_vocab(w, n: int) -> None:
    """A SentencePiece-style vocabulary of n placeholder tokens that llama.cpp loads."""
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "<0x0A>"] + [f"<t{i}>" for i in range(4, n)])
    w.add_token_scores([0.0] * n)
    w.add_token_types([2, 3, 3, 6] + [1] * (n - 4))


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf-py", required=True, type=Path, help="llama.cpp's gguf-py folder")
    a = ap.parse_args()
    sys.path.insert(0, str(a.gguf_py.resolve()))
    sys.path.insert(0, str(ROOT))
    import gguf
    from llama_cpp import Llama

    import specdec

    for name, kw in CASES.items():
        case = json.loads((FIXTURES / f"{name}.json").read_text())
        tokens, ref = case["tokens"], np.asarray(case["logits"])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.gguf"
            retokenized_copy(gguf, FIXTURES / f"{name}.gguf", path, sentencepiece_vocab)
            llm = Llama(model_path=str(path), n_ctx=len(tokens), logits_all=True, verbose=False,
                        n_threads=2, n_batch=len(tokens), n_ubatch=len(tokens))
            llm.eval(tokens)
            got = np.array(llm.scores[:len(tokens)])
            ours = specdec.load(str(path), **kw).logits(tokens)
        print(f"{name}: {len(tokens)} tokens, llama.cpp context {llm.n_ctx()}, max|d| / max|ref|:")
        print(f"  llama.cpp against transformers {rel(got, ref):.2e}, specdec against llama.cpp "
              f"{rel(ours, got):.2e}, specdec against transformers {rel(ours, ref):.2e}")

if __name__ == "__main__":
    main()
