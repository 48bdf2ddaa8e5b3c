"""How far two correct implementations of SmolLM2-135M Q4_1 can disagree: the teacher-forced
logits of the llama.cpp parity fixture's prompts computed by specdec's own kernel paths
(SPECDEC_SIMD: the widest this CPU has, avx2, scalar: the same arithmetic in other summation
orders), compared with each other and with llama.cpp's recorded logits (batched, and one token
at a time: two of llama.cpp's own paths).

Both engines quantize activations to 8 bits in blocks of 32, and this model has very large
activations in a few channels, so a last-bit difference anywhere can move a rounding boundary
and shift later logits by tenths; this measures that noise floor.

    python benchmarks/parity_noise.py [--model SmolLM2-135M-Instruct.Q4_1.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "smollm2_llamacpp.json"

CHILD = r"""
import json, sys
import numpy as np
import specdec
from specdec import _core
fx = json.load(open(sys.argv[1]))
m = specdec.load(sys.argv[2])
rows = [m.logits(p["tokens"]) for p in fx["prompts"]]
np.save(sys.argv[3], np.concatenate(rows))
print(_core.simd_name())
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="the GGUF (default: the smollm2 alias)")
    ap.add_argument("--tmp", default="/tmp", help="where the children write their logits")
    a = ap.parse_args()
    model = a.model
    if model is None:
        from specdec import hub

        model = hub.resolve(hub.DEFAULT_MODEL)
    fx = json.loads(FIXTURE.read_text())
    ref_ids = np.concatenate([np.array(p["top_logits"])[:, 0, 0] for p in fx["prompts"]]).astype(int)
    # llama.cpp one token at a time, scored on the batched top-20 ids: top-1 the same?
    self_agree = np.mean(np.concatenate([np.argmax(p["top_logits_stepwise"], axis=1) == 0
                                         for p in fx["prompts"]]))
    runs = {}
    for simd in ("", "avx2", "scalar"):
        out = os.path.join(a.tmp, f"parity_noise_{simd or 'default'}.npy")
        env = {k: v for k, v in os.environ.items() if k != "SPECDEC_SIMD"}
        if simd:
            env["SPECDEC_SIMD"] = simd
        r = subprocess.run([sys.executable, "-c", CHILD, str(FIXTURE), model, out], env=env,
                           capture_output=True, text=True, check=True)
        runs[r.stdout.strip()] = np.load(out)
    names = list(runs)
    print(f"{len(ref_ids)} teacher-forced positions over {len(fx['prompts'])} prompts\n")
    print("| A | B | top-1 agreement | mean abs logit diff | max |\n|---|---|---|---|---|")
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            d = np.abs(runs[x] - runs[y])
            agree = np.mean(runs[x].argmax(1) == runs[y].argmax(1))
            print(f"| specdec {x} | specdec {y} | {agree:.1%} | {d.mean():.3f} | {d.max():.2f} |")
    for x in names:
        print(f"| specdec {x} | llama.cpp batched | {np.mean(runs[x].argmax(1) == ref_ids):.1%} "
              f"| | |")
    print(f"| llama.cpp one token at a time | llama.cpp batched | {self_agree:.1%} | | |")


if __name__ == "__main__":
    main()
