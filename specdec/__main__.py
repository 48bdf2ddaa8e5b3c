"""Command line: ``specdec chat``, ``specdec demo``, ``specdec run``, ``specdec info`` (or
``python -m specdec ...``).

``chat`` answers a prompt with a chat model (default: SmolLM2-135M-Instruct, fetched once).

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
from typing import List, Optional

from .hub import DEFAULT_MODEL


def _print_generation(model, prompt: List[int], gen) -> None:
    print(f"model   : {model}")
    print(f"prompt  : {prompt}")
    print(f"tokens  : {gen.tokens}")
    print(f"speed   : {len(gen.tokens)} tokens in {gen.time_s:.3f} s = "
          f"{gen.tokens_per_s:.1f} tokens/s (prefill included, {model.threads} threads)")


def cmd_chat(args: argparse.Namespace) -> int:
    import specdec

    t0 = time.perf_counter()
    model = specdec.load(args.model, threads=args.threads)
    tok = model.require_tokenizer()
    load_s = time.perf_counter() - t0
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": args.prompt})
    gen = specdec.generate(model, messages, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, seed=args.seed)
    print(gen.text)
    print(f"\n[{os.path.basename(model.path)}: {len(gen.prompt_tokens)} prompt tokens, "
          f"{len(gen.tokens)} new tokens in {gen.time_s:.2f} s = {gen.tokens_per_s:.1f} tokens/s "
          f"(prefill included), {model.threads} threads, finish: {gen.finish_reason}; "
          f"load {load_s:.2f} s, tokenizer vocab {tok.vocab_size}]", file=sys.stderr)
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

    c = sub.add_parser("chat", help="answer a prompt with a chat model")
    c.add_argument("prompt", help="the user message")
    c.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"a model alias, .gguf file or HF directory (default: {DEFAULT_MODEL})")
    c.add_argument("--system", default=None, help="a system message")
    c.add_argument("--max-new-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--threads", type=int, default=None)
    c.set_defaults(func=cmd_chat)

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
