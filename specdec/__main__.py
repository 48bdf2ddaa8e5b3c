"""Command line: ``specdec chat``, ``specdec serve``, ``specdec demo``, ``specdec run``,
``specdec info`` (or ``python -m specdec ...``).

``chat`` talks with a chat model (default: SmolLM2-135M-Instruct, fetched once), streaming its
answers and speculating (prompt lookup by default); ``serve`` runs an OpenAI-compatible server.

``demo`` writes a model with random weights of a named shape to a temporary directory, loads it
and decodes greedily: the whole pipeline (GGUF writing and loading, the C forward pass, the
decoding loop) in one command, without any download.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import List, Optional, Tuple

from .hub import DEFAULT_MODEL


def _print_generation(model, prompt: List[int], gen) -> None:
    print(f"model   : {model}")
    print(f"prompt  : {prompt}")
    print(f"tokens  : {gen.tokens}")
    print(f"speed   : {len(gen.tokens)} tokens in {gen.time_s:.3f} s = "
          f"{gen.tokens_per_s:.1f} tokens/s (prefill included, {model.threads} threads)")


SPECULATOR_NAMES = ("prompt-lookup (n-gram lookup in the conversation), token-recycling, "
                   "layerskip:N (the model's first N layers draft), draft:MODEL (a small model "
                   "with the same tokenizer), none (plain decoding)")


def speculator_from_name(name: str, model, threads: Optional[int] = None):
    """The speculator a command line names (see SPECULATOR_NAMES), or None for "none"."""
    import specdec

    kind, _, arg = name.partition(":")
    if kind == "none" and not arg:
        return None
    if kind == "prompt-lookup" and not arg:
        return specdec.PromptLookup()
    if kind == "token-recycling" and not arg:
        return specdec.TokenRecycling()
    if kind == "layerskip" and arg.isdigit():
        return specdec.LayerSkip(int(arg))
    if kind == "draft" and arg:
        return specdec.DraftModel(specdec.load(arg, threads=threads))
    raise ValueError(f"unknown speculator {name!r}; known: {SPECULATOR_NAMES}")


def plain_step_s(model) -> float:
    """Seconds one plain decoding step takes on `model` after a short prompt: the time from the
    first new token (which comes with the prefill) to the 33rd, over 32 (the best of two)."""
    import specdec

    prompt = model.require_tokenizer().encode("Hello, how are you?", add_special=True)
    best = float("inf")
    for _ in range(2):
        times: List[float] = []
        specdec.generate(model, prompt, max_new_tokens=33, stop_tokens=[],
                         on_token=lambda t: times.append(time.perf_counter()))
        best = min(best, (times[-1] - times[0]) / (len(times) - 1))
    return best


def closing_line(gen, plain_s: Optional[float]) -> str:
    """Tokens/s, and for a speculative turn its acceptance and estimated speed-up."""
    line = (f"[{len(gen.tokens)} new tokens in {gen.time_s:.2f} s = {gen.tokens_per_s:.1f} tokens/s "
            f"(prefill included)")
    st = gen.stats
    if st is not None:
        line += (f"; drafts accepted {st.accepted}/{st.drafted} "
                 f"({100 * st.acceptance_rate:.0f} %), {st.mean_accepted_tokens:.2f} tokens "
                 f"per forward")
        decode_s = st.time_draft_s + st.time_verify_s
        if plain_s is not None and decode_s > 0 and len(gen.tokens) > 1:
            # the first token comes with the prefill, which plain decoding pays the same
            line += (f"; ~{(len(gen.tokens) - 1) * plain_s / decode_s:.2f}x plain decoding "
                     f"(estimated from a plain step timed at start)")
    return line + f"; finish: {gen.finish_reason}]"


def _answer(model, messages, args, speculator, seed: Optional[int]):
    """Streams one answer to stdout; its Generation."""
    import specdec

    s = specdec.stream(model, messages, max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, top_p=args.top_p, seed=seed,
                       speculator=speculator, repetition_penalty=args.repetition_penalty,
                       frequency_penalty=args.frequency_penalty,
                       presence_penalty=args.presence_penalty)
    while True:
        try:
            print(next(s), end="", flush=True)
        except StopIteration as e:
            print()
            return e.value


def cmd_chat(args: argparse.Namespace) -> int:
    import specdec

    t0 = time.perf_counter()
    model = specdec.load(args.model, threads=args.threads, context_length=args.context_length)
    model.require_tokenizer()
    speculator = speculator_from_name(args.speculator, model, args.threads)
    plain_s = plain_step_s(model) if speculator is not None else None
    print(f"[{os.path.basename(model.path)}, {model.threads} threads, speculator: "
          f"{speculator!r}, temperature {args.temperature}; ready in "
          f"{time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    interactive = args.prompt is None
    if interactive:
        print("[an empty line or Ctrl-D ends the chat; Ctrl-C stops an answer]",
              file=sys.stderr)
    turn = 0
    while True:
        if interactive:
            try:
                text = input("> ").strip()
            except (EOFError, KeyboardInterrupt):
                print(file=sys.stderr)
                return 0
            if not text:
                return 0
        else:
            text = args.prompt
        messages.append({"role": "user", "content": text})
        seed = None if args.seed is None else args.seed + turn
        try:
            gen = _answer(model, messages, args, speculator, seed)
        except KeyboardInterrupt:
            if not interactive:
                raise
            print("\n[stopped]", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": gen.text})
        print(closing_line(gen, plain_s), file=sys.stderr)
        turn += 1
        if not interactive:
            return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import specdec

    try:
        from specdec import serve
    except ImportError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    model = specdec.load(args.model, threads=args.threads, max_sequences=args.max_sequences,
                         context_length=args.context_length)
    speculator = speculator_from_name(args.speculator, model, args.threads)
    print(f"specdec serve: {model}, speculator {speculator!r}, at most {args.max_sequences} "
          f"requests decoding at once, on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr)
    serve.serve(model, speculator, host=args.host, port=args.port, name=args.model,
                log_level=args.log_level)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import specdec
    from specdec import testing

    cfg = testing.SHAPES[args.shape]
    with tempfile.TemporaryDirectory(prefix="specdec-demo-") as tmp:
        path = os.path.join(tmp, f"{args.shape}-random-{args.dtype.lower()}.gguf")
        t0 = time.perf_counter()
        testing.write_gguf(path, cfg, testing.random_weights(cfg, seed=args.seed),
                           dtype=args.dtype)
        print(f"wrote a random {args.shape} model ({os.path.getsize(path) / 1e6:.1f} MB, "
              f"{args.dtype}) in {time.perf_counter() - t0:.1f} s")
        model = specdec.load(path, threads=args.threads)
        prompt = [(7 * i + 3) % cfg.vocab for i in range(args.prompt_len)]
        gen = specdec.generate(model, prompt, max_new_tokens=args.max_new_tokens)
        _print_generation(model, prompt, gen)
        check = specdec.generate(model, prompt, max_new_tokens=args.max_new_tokens)
        print(f"repeat  : {'identical' if check.tokens == gen.tokens else 'DIFFERENT'}")
        del model
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import specdec

    model = specdec.load(args.model, threads=args.threads)
    prompt = [int(t) for t in args.tokens.replace(",", " ").split()]
    gen = specdec.generate(model, prompt, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, seed=args.seed)
    _print_generation(model, prompt, gen)
    return 0


def perplexity(model, ids: List[int], ctx: int, bos: Optional[int] = None
               ) -> Tuple[float, int, int]:
    """The mean negative log-likelihood of a text's tokens (ids), scored as llama.cpp's
    perplexity tool does: the text cut into windows of ctx tokens, each window's second half
    scored (every scored token sees at least ctx / 2 tokens before it), each window starting
    with `bos` when given (a model that adds one); with the windows and tokens scored."""
    if ctx < 2 or len(ids) < ctx:
        raise ValueError(f"the text has {len(ids)} tokens: perplexity needs at least one window "
                         f"of --ctx {ctx} tokens (at least 2)")
    total, scored, windows = 0.0, 0, len(ids) // ctx
    for w in range(windows):
        window = ids[w * ctx:(w + 1) * ctx]
        lps, _ = model.token_logprobs(window if bos is None else [bos] + window[1:])
        half = lps[ctx // 2 - 1:]  # lps[i] scores token i + 1
        total -= sum(half)
        scored += len(half)
    return total / scored, windows, scored


def cmd_perplexity(args: argparse.Namespace) -> int:
    import math
    import time

    import specdec

    model = specdec.load(args.model, threads=args.threads)
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    tok = model.require_tokenizer()
    ids = tok.encode(text, add_special=True)
    ctx = min(args.ctx, model.config.context_length)
    t0 = time.perf_counter()
    nll, windows, scored = perplexity(model, ids, ctx, tok.bos_id if tok.add_bos else None)
    print(f"{args.file}: {len(ids)} tokens, {windows} windows of {ctx}, {scored} scored; "
          f"mean NLL {nll:.4f}, perplexity {math.exp(nll):.4f} "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import specdec
    from specdec import _core

    print(f"specdec {specdec.__version__}")
    print(f"CPU kernels : {_core.simd_name()}")
    probe = _core.cuda_probe()
    if probe is None:
        print("CUDA        : not compiled in (CPU-only build)")
    else:
        print(f"CUDA        : backend compiled in, cuBLAS {probe['cublas_version']}, "
              f"{probe['devices']} device(s) visible (device='cuda' needs one)")
    if args.model:
        model = specdec.load(args.model)
        print(model)
        for k, v in vars(model.config).items():
            print(f"  {k:16s}: {v}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="specdec", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("chat", help="chat with a model, speculating (a prompt loop when no "
                       "prompt is given)")
    c.add_argument("prompt", nargs="?", default=None,
                   help="one user message to answer; without it, an interactive chat")
    c.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"a model alias, .gguf file or HF directory (default: {DEFAULT_MODEL})")
    c.add_argument("--speculator", default="prompt-lookup",
                   help=f"where drafts come from: {SPECULATOR_NAMES} (default: prompt-lookup)")
    c.add_argument("--system", default=None, help="a system message")
    c.add_argument("--max-new-tokens", type=int, default=512)
    c.add_argument("--temperature", type=float, default=0.6,
                   help="sampling temperature (default 0.6; 0 decodes greedily)")
    c.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass (default 0.9)")
    c.add_argument("--seed", type=int, default=None,
                   help="makes the answers reproducible (turn i uses seed + i)")
    c.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 discourages tokens already in the conversation (default 1: off)")
    c.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="in [-2, 2]: per repeat of a token in the answer (default 0: off)")
    c.add_argument("--presence-penalty", type=float, default=0.0,
                   help="in [-2, 2]: for a token the answer holds at all (default 0: off)")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--context-length", type=int, default=None,
                   help="the longest conversation in tokens (default: the model's; LongRoPE "
                        "models: their original context, and above it their long factors)")
    c.set_defaults(func=cmd_chat)

    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs specdec[serve])")
    v.add_argument("--model", required=True, help="a model alias, .gguf file or HF directory")
    v.add_argument("--speculator", default="prompt-lookup",
                   help=f"{SPECULATOR_NAMES} (default: prompt-lookup)")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--threads", type=int, default=None)
    v.add_argument("--max-sequences", type=int, default=16,
                   help="requests decoding at once, their forwards batched (default 16); more "
                        "wait in line")
    v.add_argument("--context-length", type=int, default=None,
                   help="the longest request in tokens (default: the model's; LongRoPE "
                        "models: their original context, and above it their long factors)")
    v.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    v.set_defaults(func=cmd_serve)

    d = sub.add_parser("demo", help="decode with a random model of a named shape (no download)")
    d.add_argument("--shape", default="tiny", help="tiny | smollm2-135m (default: tiny)")
    d.add_argument("--dtype", default="F16", choices=["F32", "F16"])
    d.add_argument("--prompt-len", type=int, default=16)
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("run", help="decode from a model file with a prompt of token ids")
    r.add_argument("model", help="a .gguf file or a Hugging Face model directory")
    r.add_argument("tokens", help="prompt token ids, e.g. '1 2 3'")
    r.add_argument("--max-new-tokens", type=int, default=64)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--threads", type=int, default=None)
    r.set_defaults(func=cmd_run)

    q = sub.add_parser("perplexity", help="a text file's perplexity under a model (llama.cpp's "
                       "windows: each window's second half scored)")
    q.add_argument("file", help="a UTF-8 text file")
    q.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"a model alias, .gguf file or HF directory (default: {DEFAULT_MODEL})")
    q.add_argument("--ctx", type=int, default=512, help="window length in tokens (default 512)")
    q.add_argument("--threads", type=int, default=None)
    q.set_defaults(func=cmd_perplexity)

    i = sub.add_parser("info", help="build information, and a model's configuration")
    i.add_argument("model", nargs="?", default=None)
    i.set_defaults(func=cmd_info)

    args = p.parse_args(argv)
    if getattr(args, "shape", None) is not None:
        from specdec import testing

        if args.shape not in testing.SHAPES:
            p.error(f"unknown shape {args.shape!r}; known: {', '.join(testing.SHAPES)}")
    try:
        return args.func(args)
    except (ValueError, OSError, NotImplementedError) as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
