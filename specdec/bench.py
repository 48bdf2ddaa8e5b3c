"""Spec-Bench-style evaluation: ``python -m specdec.bench --data spec_bench.jsonl``.

Runs plain decoding and each speculative method over the questions of a Spec-Bench-format JSONL
file (one object per line: ``question_id``, ``category``, ``turns``), the first turn of each
rendered with the model's chat template, methods interleaved question by question so machine
noise hits them alike (``--repeats n``: n runs of each, in rotated order, the median time
kept). Reports per category and overall: mean accepted tokens per target
forward (tau), acceptance rate, tokens/s, and the speedup over plain decoding measured in the
same run, end to end and for the decoding phase alone (the prompt's prefill, timed once per
question, taken off both sides), with the speedup the textbook formula predicts from the
measured acceptance rate next to it. Before the questions each method serves one short untimed
request (its time is ``warmup_s`` in the JSON): a speculator that sizes its trees by the verify
cost measures that curve at its first request, and the measurement is not the speed of a
category. Writes a markdown table (stdout, or --markdown) and, with --json, the raw numbers.

Only the first turn of multi-turn questions is used (a second turn would feed the model's own
first answer back, which differs between runs at temperature > 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from statistics import median
from typing import Dict, List, Optional

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover - tqdm is a dependency; keep the module importable
    def tqdm(it, **kw):
        return it

import specdec

from .hub import DEFAULT_MODEL


def predicted_speedup(alpha: float, k: float, c: float = 0.0) -> float:
    """Expected speedup of speculative decoding with acceptance rate alpha, k draft tokens per
    step and a draft cost c relative to one target forward (Leviathan et al. 2023, eq. 1, with a
    verify step costing one target forward)."""
    if alpha >= 1.0:
        return (k + 1) / (1 + k * c)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (1 + k * c))


def trailing_loop(tokens: List[int], max_period: int = 128, min_tokens: int = 32) -> int:
    """How many tokens at the end of ``tokens`` repeat a period of at most ``max_period`` tokens:
    the length of the longest suffix that is periodic with some period p <= max_period, spans
    at least two periods and at least ``min_tokens`` tokens; 0 without such a suffix.

    Greedy decoding of a small model often ends in such a loop (the same sentence or list item
    again and again until the token limit); prompt lookup copies a loop at almost no cost, so the
    share of looped tokens says how much of a speedup comes from it."""
    n, best = len(tokens), 0
    for p in range(1, min(max_period, n // 2) + 1):
        i = n - 1 - p
        while i >= 0 and tokens[i] == tokens[i + p]:
            i -= 1
        run = n - 1 - i  # tokens[i+1:] has period p
        if run >= 2 * p and run >= min_tokens:
            best = max(best, run)
    return best


#: the methods --methods may name
METHODS = ("plain", "lookup", "lookup-tree", "lookup-history", "lookup-tree-history", "layerskip",
           "draft", "recycling", "recycling-lookup", "recycling-lookup-history", "eagle",
           "eagle-lookup", "eagle-tree", "eagle-tree-lookup", "eagle-tree-lookup-history",
           "medusa")


def load_questions(path: str, limit: int) -> List[dict]:
    """The questions of a Spec-Bench JSONL file (at most ``limit`` per category, 0: all).
    Raises ValueError naming the file and line of a malformed one, OSError for an unreadable
    file."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not a JSON object ({e})") from None
            if not isinstance(r, dict):
                raise ValueError(f"{path}:{n}: not a JSON object")
            turns = r.get("turns")
            if (not isinstance(turns, list) or not turns or not isinstance(turns[0], str)
                    or not isinstance(r.get("category"), str)):
                raise ValueError(f"{path}:{n}: every line needs 'category' (a string) and "
                                 f"'turns' (a non-empty list of strings)")
            rows.append(r)
    if limit:
        per: Dict[str, int] = defaultdict(int)
        kept = []
        for r in rows:
            if per[r["category"]] < limit:
                per[r["category"]] += 1
                kept.append(r)
        rows = kept
    return rows


def load_draft(args: argparse.Namespace, model) -> "specdec.Model":
    """The draft model of the "draft" method: --draft, or the target's first --draft-layers
    layers written to a temporary GGUF (specdec.gguf_edit) when no smaller model sharing its
    tokenizer is at hand."""
    if args.draft:
        return specdec.load(args.draft, threads=args.threads, kv_dtype=args.kv_dtype)
    if not model.path.endswith(".gguf"):
        raise ValueError("--draft-layers needs a GGUF target; pass --draft for other formats")
    import os
    import tempfile

    from .gguf_edit import truncate_layers

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"first{args.draft_layers}.gguf")
        truncate_layers(model.path, path, args.draft_layers)
        draft = specdec.load(path, threads=args.threads, kv_dtype=args.kv_dtype)
        # the model maps the file; on POSIX systems the mapping outlives the file's name
    return draft


def run(args: argparse.Namespace, rows: Optional[List[dict]] = None) -> dict:
    """Every question of `rows` (default: read from --data) with plain decoding and each method."""
    model = specdec.load(args.model, threads=args.threads, kv_dtype=args.kv_dtype)
    # every method computes its own prefill: with prefix reuse the methods after the first
    # would take the prompt's keys and values from the run before and look faster than they are
    model.prefix_cache = 0
    tok = model.require_tokenizer()
    methods = {"plain": None}
    draft_cost = {"lookup": 0.0}  # one draft token's cost relative to a target forward
    for name in args.methods.split(","):
        name = name.strip()
        if name == "lookup":
            methods["lookup"] = specdec.PromptLookup(k=args.k, max_ngram=args.max_ngram,
                                                     min_ngram=1, verify_slope=args.verify_slope,
                                                     branching=args.branching)
        elif name == "lookup-tree":  # beside the chain in the same run
            methods["lookup-tree"] = specdec.PromptLookup(
                k=args.k, max_ngram=args.max_ngram, min_ngram=1, verify_slope=args.verify_slope,
                branching=args.tree_branching, size_by_cost=not args.tree_whole)
            draft_cost["lookup-tree"] = 0.0
        elif name in ("lookup-history", "lookup-tree-history"):  # with earlier answers
            tree = name == "lookup-tree-history"
            methods[name] = specdec.PromptLookup(
                k=args.k, max_ngram=args.max_ngram, min_ngram=1, verify_slope=args.verify_slope,
                branching=args.tree_branching if tree else args.branching,
                size_by_cost=(not args.tree_whole) if tree else None, history=args.history)
            draft_cost[name] = 0.0
        elif name == "layerskip":
            methods["layerskip"] = specdec.LayerSkip(args.skip_layers, k=args.skip_k,
                                                     p_min=args.p_min,
                                                     verify_slope=args.model_slope,
                                                     branching=args.model_branching,
                                                     nodes=args.model_nodes)
            draft_cost["layerskip"] = args.skip_layers / model.config.n_layers
        elif name == "draft":
            draft = load_draft(args, model)
            methods["draft"] = specdec.DraftModel(draft, k=args.draft_k, p_min=args.p_min,
                                                  verify_slope=args.model_slope,
                                                  branching=args.model_branching,
                                                  nodes=args.model_nodes)
            # a draft forward reads the draft's weights as a target forward reads the target's
            draft_cost["draft"] = draft.weight_bytes / model.weight_bytes
        elif name == "recycling":
            widths = tuple(int(w) for w in args.tree_widths.split(","))
            methods["recycling"] = specdec.TokenRecycling(nodes=args.tree_nodes, widths=widths,
                                                          adaptive=not args.tree_whole)
            draft_cost["recycling"] = 0.0
        elif name in ("recycling-lookup", "recycling-lookup-history"):  # lookup as a branch
            widths = tuple(int(w) for w in args.tree_widths.split(","))
            methods[name] = specdec.TokenRecycling(
                nodes=args.tree_nodes, widths=widths, adaptive=not args.tree_whole,
                lookup=min(args.k, 32), history=args.history if name.endswith("history") else 0)
            draft_cost[name] = 0.0
        elif name == "eagle":
            methods["eagle"] = specdec.Eagle(args.eagle or args.model, depth=args.eagle_depth,
                                             branching=args.model_branching,
                                             nodes=args.model_nodes, p_min=args.p_min,
                                             size_by_cost=not args.eagle_whole)
            draft_cost["eagle"] = 0.0  # counted in the measured time; not modelled here
        elif name == "eagle-lookup":  # the chain with prompt lookup beside the head
            methods["eagle-lookup"] = specdec.Eagle(args.eagle or args.model,
                                                    depth=args.eagle_depth, p_min=args.p_min,
                                                    size_by_cost=not args.eagle_whole,
                                                    lookup=args.k)
            draft_cost["eagle-lookup"] = 0.0
        elif name in ("eagle-tree-lookup", "eagle-tree-lookup-history"):  # lookup beside it
            methods[name] = specdec.Eagle(
                args.eagle or args.model, depth=args.eagle_depth,
                branching=args.eagle_branching, nodes=args.eagle_nodes, p_min=args.p_min,
                size_by_cost=not args.eagle_whole, lookup=args.k,
                history=args.history if name.endswith("history") else 0)
            draft_cost[name] = 0.0
        elif name == "eagle-tree":  # beside the chain in the same run
            methods["eagle-tree"] = specdec.Eagle(args.eagle or args.model,
                                                  depth=args.eagle_depth,
                                                  branching=args.eagle_branching,
                                                  nodes=args.eagle_nodes, p_min=args.p_min,
                                                  size_by_cost=not args.eagle_whole)
            draft_cost["eagle-tree"] = 0.0
        elif name == "medusa":
            if not args.medusa:
                raise ValueError("the medusa method needs --medusa DIR (Medusa heads)")
            methods["medusa"] = specdec.Medusa(args.medusa)
            draft_cost["medusa"] = 0.0
        elif name and name != "plain":
            raise ValueError(f"unknown method {name!r} (known: {', '.join(METHODS[1:])})")
    if rows is None:
        rows = load_questions(args.data, args.limit)
    sampling = {"top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}
    # One short untimed request per method first: the first request of a speculator that sizes
    # its trees by the verify cost measures that curve on the model (about a second), which
    # would otherwise land in the first question's time and its category's ratio. Its time is
    # reported (warmup_s), not hidden.
    warm_ids = tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "Say hello in three words."}]))
    warmup_s = {}
    for name, spec in methods.items():
        t0 = time.perf_counter()
        specdec.generate(model, warm_ids, max_new_tokens=4, temperature=args.temperature,
                         seed=args.seed, speculator=spec, **sampling)
        warmup_s[name] = time.perf_counter() - t0
    results = []
    ctx = model.config.context_length
    for r in tqdm(rows, desc="questions", file=sys.stderr):
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": r["turns"][0]}]))
        if len(ids) + args.max_new_tokens > ctx:
            continue
        entry = {"question_id": r.get("question_id"), "category": r["category"],
                 "prompt_tokens": len(ids), "methods": {}}
        # the prompt's prefill alone (every method does it once), to report the decoding
        # phase's speedup next to the end-to-end one
        prefills = []
        for _ in range(args.repeats):
            cache = model.new_cache(len(ids))
            t0 = time.perf_counter()
            model.forward(cache, ids, n_logits=1)
            prefills.append(time.perf_counter() - t0)
            del cache
        entry["prefill_s"] = median(prefills)
        names = list(methods)
        times: Dict[str, List[float]] = defaultdict(list)
        for r in range(args.repeats):
            # each repeat starts the rotation one method later: none always runs first
            for name in names[r % len(names):] + names[:r % len(names)]:
                spec = methods[name]
                t0 = time.perf_counter()
                g = specdec.generate(model, ids, max_new_tokens=args.max_new_tokens,
                                     temperature=args.temperature, seed=args.seed,
                                     speculator=spec, **sampling)
                times[name].append(time.perf_counter() - t0)
                if r > 0:
                    continue  # the same seed: the same tokens and counts every repeat
                m = {"new_tokens": len(g.tokens), "finish": g.finish_reason}
                if spec is None:
                    m["loop_tokens"] = trailing_loop(list(g.tokens))
                if g.stats is not None:
                    m.update(steps=g.stats.steps, drafted=g.stats.drafted,
                             accepted=g.stats.accepted, steps_by_nodes=g.stats.steps_by_nodes,
                             time_draft_s=g.stats.time_draft_s,
                             time_verify_s=g.stats.time_verify_s,
                             time_loop_s=g.stats.time_total_s)
                entry["methods"][name] = m
        for name in names:
            entry["methods"][name]["time_s"] = median(times[name])
            if args.repeats > 1:
                entry["methods"][name]["times_s"] = times[name]
        results.append(entry)
    return {"model": model.path, "threads": model.threads, "temperature": args.temperature,
            "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
            "max_new_tokens": args.max_new_tokens, "k": args.k, "data": args.data,
            "repeats": args.repeats, "draft_cost": draft_cost, "warmup_s": warmup_s,
            "questions": results}


def summarize(res: dict) -> str:
    cats = sorted({q["category"] for q in res["questions"]}) + ["overall"]
    methods = [m for m in res["questions"][0]["methods"] if m != "plain"] if res["questions"] \
        else []
    lines = ["| category | n | plain tok/s | plain at limit | plain looped | " + " | ".join(
        f"{m} tok/s | {m} speedup | {m} decode speedup | {m} tau | {m} accept | {m} predicted"
        for m in methods) + " |", "|---|---|---|---|---|" + "---|---|---|---|---|---|" * len(methods)]
    for cat in cats:
        qs = [q for q in res["questions"] if cat == "overall" or q["category"] == cat]
        if not qs:
            continue
        pt = sum(q["methods"]["plain"]["time_s"] for q in qs)
        pn = sum(q["methods"]["plain"]["new_tokens"] for q in qs)
        pf = sum(q.get("prefill_s", 0.0) for q in qs)
        # answers cut by max_new_tokens, and the share of plain output tokens in a trailing loop
        at_limit = sum(q["methods"]["plain"].get("finish") == "length" for q in qs)
        looped = sum(q["methods"]["plain"].get("loop_tokens", 0) for q in qs)
        cells = [cat, str(len(qs)), f"{pn / pt:.1f}", f"{at_limit / len(qs):.0%}",
                 f"{looped / pn:.0%}" if pn else "-"]
        for m in methods:
            t = sum(q["methods"][m]["time_s"] for q in qs)
            n = sum(q["methods"][m]["new_tokens"] for q in qs)
            steps = sum(q["methods"][m]["steps"] for q in qs)
            drafted = sum(q["methods"][m]["drafted"] for q in qs)
            acc = sum(q["methods"][m]["accepted"] for q in qs)
            alpha = acc / drafted if drafted else 0.0
            k_mean = drafted / steps if steps else 0.0
            cost = res.get("draft_cost", {}).get(m, 0.0)
            decode = ((pt - pf) / pn) / ((t - pf) / n) if t > pf and pt > pf else float("nan")
            cells += [f"{n / t:.1f}", f"{(pt / pn) / (t / n):.2f}x", f"{decode:.2f}x",
                      f"{n / steps:.2f}",
                      f"{alpha:.2f}", f"{predicted_speedup(alpha, k_mean, cost):.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="Spec-Bench-format JSONL")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--methods", default="lookup",
                   help="comma-separated: lookup, lookup-tree, lookup-history, "
                   "lookup-tree-history, layerskip, draft, recycling, recycling-lookup, "
                   "recycling-lookup-history, eagle, eagle-lookup, eagle-tree, "
                   "eagle-tree-lookup, eagle-tree-lookup-history, medusa")
    p.add_argument("--draft", help="draft: a model sharing the target's tokenizer")
    p.add_argument("--eagle", help="eagle: an EAGLE head directory (default: the head shipped "
                   "for --model's alias)")
    p.add_argument("--eagle-depth", type=int, default=5, help="eagle, eagle-tree: draft depth")
    p.add_argument("--eagle-branching", type=int, default=3,
                   help="eagle-tree(-lookup): children per expanded node")
    p.add_argument("--eagle-nodes", type=int, default=12, help="eagle-tree(-lookup): the most nodes")
    p.add_argument("--medusa", help="medusa: a Medusa heads directory")
    p.add_argument("--draft-layers", type=int, default=20,
                   help="draft without --draft: the target's first this many layers as a "
                        "separate model")
    p.add_argument("--draft-k", type=int, default=3, help="draft: draft length")
    p.add_argument("--skip-layers", type=int, default=20,
                   help="layerskip: the draft exits after this many of the target's layers")
    p.add_argument("--skip-k", type=int, default=2, help="layerskip: draft length")
    p.add_argument("--p-min", type=float, default=0.0,
                   help="layerskip, draft: stop drafting after a token the draft is less sure "
                        "of")
    p.add_argument("--model-slope", type=float, default=0.2,
                   help="layerskip, draft: adaptive draft length's verify slope (0 = off)")
    p.add_argument("--tree-nodes", type=int, default=16,
                   help="recycling(-lookup): the most nodes of a step's template")
    p.add_argument("--tree-widths", default="4,2,2,1,1,1",
                   help="recycling(-lookup): children per node at each depth, comma-separated")
    p.add_argument("--branching", type=int, default=1,
                   help="lookup: sibling branches from other occurrences (1 = a chain)")
    p.add_argument("--tree-branching", type=int, default=3,
                   help="lookup-tree: sibling branches from other occurrences")
    p.add_argument("--model-branching", type=int, default=1,
                   help="layerskip, draft, eagle: children per expanded node (1 = a chain)")
    p.add_argument("--model-nodes", type=int, default=16,
                   help="layerskip, draft, eagle: the most nodes of a tree (with "
                   "--model-branching > 1)")
    p.add_argument("--eagle-whole", action="store_true",
                   help="eagle, eagle-tree: draft the whole depth (or nodes) every step, not "
                   "only what pays by the measured verify cost")
    p.add_argument("--tree-whole", action="store_true",
                   help="recycling(-lookup), lookup-tree: draft the whole template or tree "
                        "every step (default: the nodes that pay at the measured verify costs)")
    p.add_argument("--k", type=int, default=16,
                   help="lookup, lookup-tree, eagle-lookup, recycling-lookup (at most 32): the "
                        "most lookup drafts per step")
    p.add_argument("--max-ngram", type=int, default=4)
    p.add_argument("--history", type=int, default=65536,
                   help="the *-history methods: earlier answers' tokens kept")
    p.add_argument("--verify-slope", type=float, default=0.2,
                   help="adaptive draft length (0 = always draft k)")
    p.add_argument("--max-new-tokens", type=int, default=1024,
                   help="Spec-Bench's own setting is 1024 (its evaluation scripts)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0, help="with --temperature > 0 (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="with --temperature > 0 (1 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="with --temperature > 0 (0 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="questions per category (0 = all)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each method per question, in rotated order; its time is their "
                        "median")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--kv-dtype", choices=["f16", "f32"], default=None,
                   help="KV cache element type (default: the device's, f16 on the CPU)")
    p.add_argument("--json", help="write the raw numbers here")
    p.add_argument("--markdown", help="write the table here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    unknown = [m.strip() for m in args.methods.split(",") if m.strip() not in METHODS + ("",)]
    if unknown:
        p.error(f"--methods: unknown method {unknown[0]!r} (known: {', '.join(METHODS[1:])})")
    if "medusa" in [m.strip() for m in args.methods.split(",")] and not args.medusa:
        p.error("--methods: the medusa method needs --medusa DIR (Medusa heads)")
    try:  # checked before the model loads
        questions = load_questions(args.data, args.limit)
    except OSError as e:
        p.error(f"--data: cannot read {args.data}: {e.strerror or e}")
    except ValueError as e:
        p.error(f"--data: {e}")
    if not questions:
        p.error(f"--data: {args.data} holds no questions")
    res = run(args, questions)
    if not res["questions"]:
        p.error(f"no question of {args.data} fits the model's context with --max-new-tokens "
                f"{args.max_new_tokens}")
    table = summarize(res)
    filters = "".join(f", {n} {v}" for n, v, off in (("top-k", args.top_k, 0),
                                                     ("top-p", args.top_p, 1.0),
                                                     ("min-p", args.min_p, 0.0)) if v != off)
    header = (f"model {res['model']}, {res['threads']} threads, temperature {args.temperature}"
              f"{filters}, "
              f"max_new_tokens {args.max_new_tokens}, k {args.k}, "
              f"{len(res['questions'])} questions"
              + (f", median of {args.repeats} runs each" if args.repeats > 1 else "")
              + "; untimed warm-up request per method: "
              + ", ".join(f"{m} {t:.2f} s" for m, t in res["warmup_s"].items()) + "\n\n")
    print(header + table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
