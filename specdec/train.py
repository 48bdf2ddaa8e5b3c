"""Train draft heads by self-distillation: ``python -m specdec.train eagle3 --target MODEL``.

Stages (each resumable; a finished stage is skipped when run again with the same work dir):

1. ``prompts``  a varied prompt set: hand-written task templates x subjects, plus user turns
   the target writes itself through its chat template (``WORK/prompts.json``).
2. ``data``     the target answers every prompt (greedy, T=0.7 or T=1.0 by the prompt's index),
   batched across threads by specdec's scheduler; then one forward per sequence gives the
   residual stream entering layers 2, L//2 and L-3 and the top-k next-token logits. Shards of
   ``--shard-size`` sequences under ``WORK/data``. A second pass asks for summaries, extraction
   and translations of passages from the first pass's answers; ``--extra-prompts`` adds more
   template prompts after that (to extend a run), ``--extra-self-prompts`` more user turns the
   target writes after those, ``--long-prompts`` tasks over long contexts (several of the
   target's answers joined into documents of 1,500-4,000 characters) after them, and
   ``--translation-prompts`` requests to translate into English (sentences the target wrote,
   which it translated into another language) last.
3. ``vocab``    the draft vocabulary: the ``--draft-vocab`` most frequent answer tokens
   (EAGLE-3's rule), its coverage, ``d2t``/``t2d`` (``WORK/vocab.npz``), and the target's
   embedding table as its forward computes it (``WORK/embed.npy``).
4. ``train``    trains the head (needs torch: ``pip install specdec[train]``), checkpoints in
   ``WORK/ckpt``, one CSV row per step in ``WORK/train_log.csv``, held-out accuracy per draft
   step in ``WORK/eval_log.csv``; every checkpoint is also exported to ``--out``. The
   ``--held-out`` shards (spread over the data) are chosen once and kept in
   ``WORK/held_out.json``: shards added to a run later go to training.
5. ``export``   writes the latest checkpoint as an EAGLE-3 directory (config.json +
   model.safetensors) at ``--out``.

The evaluation prompts of the benchmarks are never read here: the prompts come only from the
templates in :mod:`specdec.train_data` and from the target itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional, Sequence

import numpy as np

from . import train_data as td


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stage_prompts(model, work: str, n_template: int, n_self: int, seed: int,
                  threads: int) -> List[str]:
    path = os.path.join(work, "prompts.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["prompts"]
    t0 = time.time()
    prompts = td.template_prompts(n_template, seed)
    own = td.self_user_turns(model, n_self, seed=seed, threads=threads) if n_self else []
    known = set(prompts)
    prompts += [p for p in own if p not in known]
    # interleave the two kinds so that every shard holds both
    rng = np.random.default_rng(seed)
    prompts = [prompts[i] for i in rng.permutation(len(prompts))]
    with open(path + ".tmp", "w") as f:
        json.dump({"prompts": prompts, "template": n_template, "self": len(own),
                   "seconds": round(time.time() - t0, 1)}, f, indent=1)
    os.replace(path + ".tmp", path)
    _log(f"prompts: {len(prompts)} ({n_template} from templates, {len(own)} written by the "
         f"target) in {time.time() - t0:.0f} s")
    return prompts


def _answers_text(model, data_dir: str, limit: int) -> List[str]:
    tok = model.require_tokenizer()
    out = []
    for p in td.list_shards(data_dir):
        sh = td.read_shard(p)
        for s in range(sh.n_seqs):
            q = sh.seq(s)
            out.append(tok.decode([int(t) for t in q["tokens"][q["answer"]:]], skip_special=True))
            if len(out) >= limit:
                return out
    return out


def _kept_list(path: str, make) -> List[str]:
    """The list kept at ``path`` (JSON), or ``make()``'s, written there first: a resumed run
    reuses the prompts of the run it resumes."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    out = make()
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)
    return out


def _check_done_shard(path: str, chunk, label: str) -> None:
    """Raises when a finished shard holds prompts other than ``chunk``'s: a round was added
    before a later round's shards (the rounds must be added in the order of the options), or
    the prompt options changed, and the run would skip this round silently."""
    meta_path = os.path.join(path, "meta.json")
    if not os.path.exists(meta_path):
        return
    with open(meta_path) as f:
        seqs = json.load(f).get("sequences", [])
    want = {p for _, p in chunk}
    if any("prompt" in q and q["prompt"] not in want for q in seqs):
        raise ValueError(f"{path} holds prompts of another round than '{label}': add data "
                         f"rounds in the order of the options (prompts, passages, extra, extra "
                         f"self, long, to English) with the earlier counts unchanged, or use "
                         f"another --work")


def stage_data(model, work: str, prompts: Sequence[str], *, n_passage: int, n_extra: int,
               n_extra_self: int, shard_size: int, n_long: int = 0, n_translate: int = 0,
               max_new_tokens: int, threads: int, k: int, seed: int,
               lookup: bool) -> None:
    from tqdm import tqdm

    from .speculators import PromptLookup

    data_dir = os.path.join(work, "data")
    os.makedirs(data_dir, exist_ok=True)
    layers = td.eagle3_layers(model.config.n_layers)
    factory = PromptLookup if lookup else None

    def run(items, first_shard: int, label: str) -> None:
        n_sh = (len(items) + shard_size - 1) // shard_size
        done = {os.path.basename(p) for p in td.list_shards(data_dir)}
        bar = tqdm(range(n_sh), desc=f"data ({label})", unit="shard", file=sys.stdout)
        for j in bar:
            name = td.shard_name(first_shard + j)
            chunk = items[j * shard_size:(j + 1) * shard_size]
            if name in done:
                _check_done_shard(os.path.join(data_dir, name), chunk, label)
                continue
            meta = td.generate_shard(model, chunk, os.path.join(data_dir, name), layers=layers,
                                     k=k, max_new_tokens=max_new_tokens, threads=threads,
                                     seed=seed, speculator_factory=factory)
            bar.set_postfix(tokens=meta["tokens"], gen_s=meta["generate_s"],
                            feat_s=meta["features_s"])
            _log(f"{name}: {len(meta['sequences'])} sequences, {meta['tokens']} tokens "
                 f"({meta['answer_tokens']} answer), generate {meta['generate_s']} s, "
                 f"features {meta['features_s']} s")

    rounds: List[Sequence[str]] = []

    def run_round(round_prompts: Sequence[str], label: str) -> None:
        # a round takes the shards and prompt indices (which pick the sampling) after the
        # rounds before it
        first = sum((len(x) + shard_size - 1) // shard_size for x in rounds)
        base = sum(len(x) for x in rounds)
        run([(base + i, p) for i, p in enumerate(round_prompts)], first, label)
        rounds.append(round_prompts)

    run_round(prompts, "prompts")
    passage: List[str] = []
    extra: List[str] = []
    if n_passage > 0:
        passage = _kept_list(os.path.join(work, "prompts_passages.json"),
                             lambda: td.passage_prompts(_answers_text(model, data_dir,
                                                                      20 * n_passage),
                                                        n_passage, seed + 1))
        run_round(passage, "passages")
    if n_extra > 0:
        # more template prompts after the first round's shards (a run extended later)
        path = os.path.join(work, "prompts_extra.json")
        if os.path.exists(path):
            with open(path) as f:
                extra = json.load(f)
        if len(extra) < n_extra:  # a larger request extends the list; earlier shards stay
            known = set(prompts) | set(extra)
            extra += [p for p in td.template_prompts(n_extra + len(known), seed + 2)
                      if p not in known][:n_extra - len(extra)]
            with open(path, "w") as f:
                json.dump(extra, f, indent=1)
        run_round(extra, "extra")
    if n_extra_self > 0:
        # more user turns the target writes itself, after the extra template prompts: closer to
        # what users ask than the templates (a head trained mostly on template answers agrees
        # with the target far less on held-out questions than on held-out template answers)
        known = set(prompts) | set(passage) | set(extra)
        run_round(_kept_list(os.path.join(work, "prompts_extra_self.json"),
                             lambda: [p for p in td.self_user_turns(model, n_extra_self,
                                                                    seed=seed + 3,
                                                                    threads=threads)
                                      if p not in known]), "extra self")
    if n_long > 0:
        # tasks over long contexts (several of the target's answers joined): the prompts above
        # hold a few hundred tokens, the documents of RAG and summarisation questions thousands
        run_round(_kept_list(os.path.join(work, "prompts_long.json"),
                             lambda: td.long_passage_prompts(
                                 _answers_text(model, data_dir, max(200, 8 * n_long)), n_long,
                                 seed + 4)), "long")
    if n_translate > 0:
        # requests to translate into English, from sentences the target wrote and translated
        # into another language itself: every prompt above is in English
        run_round(_kept_list(os.path.join(work, "prompts_to_english.json"),
                             lambda: td.to_english_prompts(
                                 model, td.english_sentences(
                                     _answers_text(model, data_dir, max(200, n_translate))),
                                 n_translate, seed + 5, threads)), "to English")


def stage_vocab(model, work: str, vd: int, held_out: int) -> dict:
    path = os.path.join(work, "vocab.npz")
    if os.path.exists(path) and os.path.exists(os.path.join(work, "embed.npy")):
        with open(os.path.join(work, "vocab.json")) as f:
            report = json.load(f)
        if report["draft_vocab"] == vd:  # done: checkpoints depend on this vocabulary
            return report
        raise ValueError(f"{path} holds a draft vocabulary of {report['draft_vocab']} tokens, "
                         f"not {vd}: use another work directory (or delete it and the "
                         f"checkpoints trained on it)")
    shards = td.list_shards(os.path.join(work, "data"))
    train_shards, held_shards = td.kept_split(work, shards, held_out)
    V = model.config.vocab_size
    counts = td.token_counts([td.read_shard(p) for p in train_shards], V)
    held = td.token_counts([td.read_shard(p) for p in held_shards], V)
    eog = sorted(model.require_tokenizer().eog_ids)
    ids, d2t, t2d, cov = td.draft_vocab(counts, vd, always=eog)
    report = {"draft_vocab": vd, "coverage": cov, "answer_tokens": int(counts.sum()),
              "distinct_tokens": int((counts > 0).sum()), "held_out_tokens": int(held.sum())}
    # coverage of the training answers, and of the held-out answers by the training vocabulary
    for v in (1024, 2048, 4096, 8192, 16384, 32000):
        if v <= V:
            t = td.draft_vocab(counts, v, always=eog)
            report[f"coverage_{v}"] = t[3]
            if held.sum():
                report[f"held_out_coverage_{v}"] = float(held[t[2]].sum() / held.sum())
    with open(os.path.join(work, "vocab.json"), "w") as f:
        json.dump(report, f, indent=1)
    np.savez(path + ".tmp.npz", ids=ids, d2t=d2t, t2d=t2d, counts=counts)
    os.replace(path + ".tmp.npz", path)  # last: its presence marks the stage done
    _log("vocab: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in report.items()))
    emb = os.path.join(work, "embed.npy")
    if not os.path.exists(emb):
        t0 = time.time()
        table = td.embedding_table(model)
        np.save(emb + ".tmp.npy", table)
        os.replace(emb + ".tmp.npy", emb)
        _log(f"embedding table {table.shape} in {time.time() - t0:.0f} s")
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.train",
                                 description="Train speculative-decoding draft heads by "
                                             "self-distillation from the target model.")
    sub = ap.add_subparsers(dest="kind", required=True)
    e = sub.add_parser("eagle3", help="an EAGLE-3 head (one decoder layer over the target's "
                                      "low/mid/high features)")
    e.add_argument("--target", required=True, help="model file, HF directory or alias")
    e.add_argument("--work", required=True, help="cache directory for data and checkpoints "
                                                 "(outside the repository)")
    e.add_argument("--out", help="directory to export the head to (default WORK/head)")
    e.add_argument("--stage", default="all",
                   choices=["prompts", "data", "vocab", "train", "export", "all"],
                   help="run up to this stage (default: all); finished stages are skipped")
    e.add_argument("--only", action="store_true", help="run only --stage, not those before")
    e.add_argument("--template-prompts", type=int, default=1200)
    e.add_argument("--self-prompts", type=int, default=400,
                   help="user turns for the target to write itself (some are dropped)")
    e.add_argument("--passage-prompts", type=int, default=200)
    e.add_argument("--extra-prompts", type=int, default=0,
                   help="more template prompts after the passage tasks (to extend a run)")
    e.add_argument("--extra-self-prompts", type=int, default=0,
                   help="more user turns written by the target, after those (some are "
                        "dropped)")
    e.add_argument("--long-prompts", type=int, default=0,
                   help="tasks over long contexts (the target's answers joined), after those")
    e.add_argument("--translation-prompts", type=int, default=0,
                   help="requests to translate the target's sentences, which it translated "
                        "into another language, back into English, after those (some are "
                        "dropped)")
    e.add_argument("--shard-size", type=int, default=32)
    e.add_argument("--max-new-tokens", type=int, default=256)
    e.add_argument("--topk", type=int, default=16, help="target logits kept per position")
    e.add_argument("--threads", type=int, default=12, help="requests generated at once")
    e.add_argument("--no-lookup", action="store_true",
                   help="generate without prompt-lookup speculation (same outputs, slower)")
    e.add_argument("--draft-vocab", type=int, default=8192)
    e.add_argument("--held-out", type=int, default=1,
                   help="shards kept for evaluation, spread over the data and chosen once "
                        "(WORK/held_out.json)")
    e.add_argument("--seed", type=int, default=0)
    # training
    e.add_argument("--intermediate-size", type=int, default=1536)
    e.add_argument("--ttt", type=int, default=3, help="training-time-test unroll steps (1: "
                                                      "teacher forcing only)")
    e.add_argument("--steps", type=int, default=4000)
    e.add_argument("--batch", type=int, default=4, help="sequences per step")
    e.add_argument("--max-len", type=int, default=512,
                   help="rows per sequence (a longer one keeps a window with its answer)")
    e.add_argument("--lr", type=float, default=5e-4)
    e.add_argument("--warmup", type=int, default=100)
    e.add_argument("--ckpt-every", type=int, default=250)
    e.add_argument("--eval-every", type=int, default=250)
    e.add_argument("--torch-threads", type=int, default=2)
    args = ap.parse_args(argv)

    work = os.path.abspath(args.work)
    out = os.path.abspath(args.out or os.path.join(work, "head"))
    os.makedirs(work, exist_ok=True)
    order = ["prompts", "data", "vocab", "train", "export"]
    last = order.index(args.stage) if args.stage != "all" else len(order) - 1
    todo = [order[last]] if args.only else order[:last + 1]
    if args.stage == "all":
        todo = [s for s in order if s != "export"]  # training exports at every checkpoint

    if any(s in todo for s in ("train", "export")):
        from . import train_eagle3  # raises with the install hint when torch is missing
        train_eagle3.require_torch()

    model = None
    if any(s in todo for s in ("prompts", "data", "vocab")):
        import specdec
        model = specdec.load(args.target)
        with open(os.path.join(work, "target.json"), "w") as f:
            json.dump({"target": args.target, "config": model.config.__dict__}, f, indent=1,
                      default=str)
    timings = {}
    prompts: List[str] = []
    if "prompts" in todo or "data" in todo:
        t0 = time.time()
        prompts = stage_prompts(model, work, args.template_prompts, args.self_prompts,
                                args.seed, args.threads)
        timings["prompts"] = time.time() - t0
    if "data" in todo:
        t0 = time.time()
        stage_data(model, work, prompts, n_passage=args.passage_prompts,
                   n_extra=args.extra_prompts, n_extra_self=args.extra_self_prompts,
                   n_long=args.long_prompts, n_translate=args.translation_prompts,
                   shard_size=args.shard_size,
                   max_new_tokens=args.max_new_tokens, threads=args.threads, k=args.topk,
                   seed=args.seed, lookup=not args.no_lookup)
        timings["data"] = time.time() - t0
    if "vocab" in todo:
        t0 = time.time()
        stage_vocab(model, work, args.draft_vocab, args.held_out)
        timings["vocab"] = time.time() - t0
    if model is not None:
        cfg = model.config
        with open(os.path.join(work, "target_config.json"), "w") as f:
            json.dump(td.eagle3_config(cfg, args.intermediate_size, args.draft_vocab), f)
        del model
    if "train" in todo:
        from . import train_eagle3
        t0 = time.time()
        train_eagle3.train(work, out, args)
        timings["train"] = time.time() - t0
    if "export" in todo:
        from . import train_eagle3
        train_eagle3.export_latest(work, out)
    for k, v in timings.items():
        _log(f"stage {k}: {v:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
