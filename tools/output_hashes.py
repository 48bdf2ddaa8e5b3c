"""Hashes of generated tokens: plain decoding and every speculator, greedy and sampled with fixed
seeds, over tiny random models (llama and qwen2, GGUF and HF, float and quantized) and, when it
can be had, SmolLM2-135M-Instruct (with the EAGLE head shipped for it, where a build has one).

A refactoring of the decoding loops must not move a single token. Run this before the change
(``--write before.json``) and after it (``--check before.json``): every run's hash must match.
It uses only the public API (``specdec.generate``), so it runs unchanged on both sides.

    python tools/output_hashes.py --write /tmp/before.json
    python tools/output_hashes.py --check /tmp/before.json

It hashes the specdec that `import specdec` finds (it prints which): an installed package, or
with PYTHONPATH set to a source tree, that tree's in-place build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import specdec
from specdec import testing

SAMPLING = [  # (temperature, top_k, top_p, min_p, seed)
    (0.0, 0, 1.0, 0.0, 0),
    (1.0, 0, 1.0, 0.0, 11),
    (0.8, 20, 0.9, 0.0, 12),
    (0.7, 0, 1.0, 0.05, 13),
]


def speculators(model: specdec.Model, draft: specdec.Model) -> dict:
    """Name -> speculator (None for plain decoding): defaults and fixed-length variants."""
    n = model.config.n_layers
    return {
        "plain": None,
        "lookup": specdec.PromptLookup(),
        "lookup_k3_fixed": specdec.PromptLookup(k=3, verify_slope=0.0),
        "lookup_k8_fixed": specdec.PromptLookup(k=8, max_ngram=2, verify_slope=0.0),
        "draft": specdec.DraftModel(draft),
        "draft_k3_fixed": specdec.DraftModel(draft, k=3, verify_slope=0.0),
        "draft_pmin": specdec.DraftModel(draft, k=6, p_min=0.3, verify_slope=0.0),
        "layerskip": specdec.LayerSkip(layers=max(1, n // 2)),
        "layerskip_k4_fixed": specdec.LayerSkip(layers=1, k=4, verify_slope=0.0),
    }


def head_speculators() -> dict:
    """EAGLE with the head shipped for SmolLM2, when this build ships one: a chain and a tree
    drafted whole, and a tree sized by a fixed cost curve (measured timings would move the
    sampled tokens from run to run)."""
    try:
        chain = specdec.Eagle("smollm2-135m-instruct", depth=3, size_by_cost=False)
    except (ValueError, FileNotFoundError):
        return {}
    sized = specdec.Eagle("smollm2-135m-instruct", depth=4, branching=3, nodes=8)
    sized.set_verify_costs([1.0 + 0.15 * i for i in range(9)])
    return {"eagle_chain3": chain, "eagle_tree_sized": sized,
            "eagle_tree_whole": specdec.Eagle("smollm2-135m-instruct", depth=4, branching=3,
                                              nodes=8, size_by_cost=False)}


def history_speculators() -> dict:
    """Prompt lookup with a history, one speculator for all of a model's runs (made once, so
    each run drafts from the outputs of the runs before it, in the fixed order of run_model)."""
    return {"lookup_history": specdec.PromptLookup(history=4096),
            "lookup_tree_history": specdec.PromptLookup(history=4096, branching=3,
                                                        size_by_cost=False)}


def run_model(name: str, model: specdec.Model, draft: specdec.Model, prompts, n_new: int,
              out: dict, extra=None) -> None:
    for pi, prompt in enumerate(prompts):
        for (t, tk, tp, mp, seed) in SAMPLING:
            for sname, spec in {**speculators(model, draft), **(extra or {})}.items():
                g = specdec.generate(model, prompt, max_new_tokens=n_new, temperature=t,
                                     top_k=tk, top_p=tp, min_p=mp, seed=seed, stop_tokens=[],
                                     speculator=spec)
                key = f"{name}/p{pi}/T{t}_k{tk}_p{tp}_m{mp}_s{seed}/{sname}"
                h = hashlib.sha256(json.dumps([g.tokens, g.finish_reason]).encode()).hexdigest()
                out[key] = h[:16]


def tiny_models(tmp: Path):
    """(name, model, draft) over random files written here."""
    res = []
    for arch in ("llama", "qwen2"):
        cfg = testing.RandomModelConfig(arch=arch, vocab=96, dim=64, n_layers=3, n_heads=4,
                                        n_kv_heads=2, ffn=128, context_length=256)
        w = testing.random_weights(cfg, seed=7)
        gg = tmp / f"{arch}.gguf"
        testing.write_gguf(gg, cfg, w, "F32")
        hf = tmp / f"{arch}_hf"
        testing.write_hf(hf, cfg, w, "F16")
        dcfg = cfg.replace(n_layers=1)
        dw = testing.random_weights(dcfg, seed=8)
        dg = tmp / f"{arch}_draft.gguf"
        testing.write_gguf(dg, dcfg, dw, "F32")
        draft = specdec.load(str(dg), threads=2)
        res.append((f"{arch}-gguf", specdec.load(str(gg), threads=2), draft))
        res.append((f"{arch}-hf", specdec.load(str(hf), threads=2), draft))
    q = specdec.dummy_model("tiny", dtype="q4_1", seed=3, threads=2)
    res.append(("dummy-q4_1", q, specdec.dummy_model("tiny", dtype="q4_1", seed=4, threads=2,
                                                     n_layers=1)))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", help="write the hashes to this JSON file")
    g.add_argument("--check", help="compare with the hashes in this JSON file")
    ap.add_argument("--no-smollm2", action="store_true", help="tiny models only")
    args = ap.parse_args()
    print(f"hashing the outputs of {specdec.__file__}")

    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        loop = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4] * 2
        # the third is longer than a prefill step (several steps of the sequence API)
        long = [(7 * i * i + 3 * i + 1) % 90 + 2 for i in range(150)] + loop
        prompts = [[1, 2, 3, 4, 5, 1, 2, 3], loop, long]
        for name, m, draft in tiny_models(Path(d)):
            run_model(name, m, draft, prompts, 48, out, history_speculators())
    if not args.no_smollm2:
        from specdec import hub

        m = specdec.load(hub.resolve(hub.DEFAULT_MODEL), threads=2)
        prompts = [
            [{"role": "user", "content": "List the planets of the solar system in order."}],
            [{"role": "user", "content": "Repeat this sentence three times: the quick brown fox "
                                         "jumps over the lazy dog."}],
            [{"role": "user", "content": "Summarise this text in one sentence. " + " ".join(
                f"Item {i} of the list is the number {i * i} written in words." for i in range(30))
              }],
        ]
        run_model("smollm2", m, m, prompts, 64, out, {**head_speculators(),
                                                       **history_speculators()})

    if args.write:
        Path(args.write).write_text(json.dumps(out, indent=1, sort_keys=True))
        print(f"{len(out)} runs hashed into {args.write}")
        return 0
    ref = json.loads(Path(args.check).read_text())
    bad = [k for k in ref if out.get(k) != ref[k]]
    missing = [k for k in out if k not in ref]
    for k in bad[:40]:
        print(f"DIFFERS: {k}: {ref[k]} -> {out.get(k)}")
    print(f"{len(ref) - len(bad)} of {len(ref)} runs identical; {len(missing)} new runs")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
