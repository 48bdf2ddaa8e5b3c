"""Record how llama.cpp tokenizes with a GGUF pre-tokenizer, as a fixture for specdec's
tokenizer (tests/fixtures/pretokenizer_<name>.json).

A pre-tokenizer cuts text into pieces before BPE merges within each piece, so its choices show
only where a merge would cross a cut. This script trains a small byte-level BPE vocabulary (with
the tokenizers library) on the test texts taken whole, so that its merges do cross word, case and
script boundaries, writes it into a GGUF file with the given tokenizer.ggml.pre (the tensors of a
tiny fixture model carry it; llama.cpp reads only the vocabulary here), and records
``llama_cpp.Llama(path, vocab_only=True).tokenize(text, add_bos=False, special=False)`` for
each text, with the vocabulary and merges, so the tests rebuild the same tokenizer from the
metadata without llama.cpp.

Needs llama-cpp-python and the gguf-py of llama.cpp's source (the llama-cpp-python sdist
carries it under vendor/llama.cpp/gguf-py); the test suite does not use this script.

    python tools/record_pretokenizer.py --gguf-py LLAMA_CPP_SOURCE_DIR/gguf-py --pre gpt-4o
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRIER = ROOT / "tests" / "fixtures" / "families" / "smollm3.gguf"

TEXTS = [  # written for this file: cases, scripts, marks, contractions, digits, whitespace
    "Hello World! It's GREAT, isn't it?  123456 numbers\n\nnew  lines\t tabs",
    "HTTPServer parseJSONString McDonald's ÉCOLE école naïve Ünïcödé ÀBC",
    "日本語のテキスト 中文 한국어 Ελληνικά русский ТЕКСТ Ελληνικά",
    "a/b/c\n/path/to\r\nCRLF don'T I'M we'LL x1y2z3 3.14159 1234567890",
    "emoji 😀👍 and combining e\u0301 a\u0308 o\u0302 CAFE\u0301",
    "   leading and trailing   ",
    "CamelCaseWordsHere AND lower UPPERlower iPhone eBay ABCdef DEFghi",
    "she'S HE'D they'Re 'tis O'Neil ǅungla ǈ Ǆ ʰʲ ᵃ",
    "x\n\n\ny\r\n\r\nz   \n  \tq",
    "def f(x):\n    return x**2  # comment\n",
    "ÆØÅ æøå Ħ ħ İstanbul ǲ",
]
SHORT = ["ÉCOLE", "e\u0301", "a\u0308bc", "ABCdef", "İstanbul", "ǅungla", "ʰʲ", "HTTPServer"]


def train_vocab() -> tuple[list[str], list[str]]:
    """A byte-level BPE trained on the texts whole (no pre-tokenization): tokens, merges."""
    import tokenizers
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 20, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [""] * len(model["vocab"])
    for text, i in model["vocab"].items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write_gguf(gguf, path: Path, pre: str, tokens: list[str], merges: list[str]) -> None:
    """The carrier model with this vocabulary (tools/families_llamacpp.py writes the file)."""
    from families_llamacpp import retokenized_copy

    def vocab(w, n: int) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([1] * len(tokens))
        w.add_token_merges(merges)

    retokenized_copy(gguf, CARRIER, path, vocab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf-py", required=True, type=Path, help="llama.cpp's gguf-py folder")
    ap.add_argument("--pre", default="gpt-4o", help="tokenizer.ggml.pre (default gpt-4o)")
    a = ap.parse_args()
    sys.path.insert(0, str(a.gguf_py.resolve()))
    import gguf
    import llama_cpp
    from llama_cpp import Llama

    tokens, merges = train_vocab()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab.gguf"
        write_gguf(gguf, path, a.pre, tokens, merges)
        llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
        ids = {t: llm.tokenize(t.encode("utf-8"), add_bos=False, special=False)
               for t in TEXTS + SHORT}
    out = ROOT / "tests" / "fixtures" / f"pretokenizer_{a.pre.replace('-', '_')}.json"
    fixture = {"about": "tools/record_pretokenizer.py: llama.cpp's token ids for a byte-level BPE "
                        "trained across piece boundaries",
               "llama_cpp_python": llama_cpp.__version__, "pre": a.pre, "tokens": tokens,
               "merges": merges, "ids": ids}
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                      for k, v in fixture.items())
    out.write_text("{\n" + body + "\n}\n", encoding="utf-8")
    print(f"{out.name}: {len(tokens)} tokens, {len(merges)} merges, {len(ids)} texts")


if __name__ == "__main__":
    main()
