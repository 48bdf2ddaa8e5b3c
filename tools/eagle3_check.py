"""Check an exported EAGLE-3 head with NumPy alone: chains drafted as inference drafts them.

Reads the head from its published files (config.json + model.safetensors, the names the C
loader reads) and the greedy sequences of held-out data shards written by
``python -m specdec.train eagle3`` (their target features, tokens and embedding table), and for
every answer position drafts a chain ``--depth`` deep: the first row from the target's
features, each further row from the head's own output with the drafted token, attending the
context rows and its chain (RoPE, GQA and norms as the head's training arithmetic). On greedy
text the target accepts a drafted token exactly when it equals the next token of the text, so
this gives, at temperature 0, the acceptance per depth and the mean tokens per verify step of a
chain (tau = 1 + accepted drafts) without running the target.

    python tools/eagle3_check.py --head WORK/head --work WORK [--depth 5] [--held-out 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specdec import train_data as td  # noqa: E402


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos, theta):
    """HF rotate_half RoPE: x (..., n, heads, hd), pos (n,)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    f = np.asarray(pos, np.float64)[:, None] * inv[None]
    cos = np.cos(np.concatenate([f, f], -1))[:, None, :]
    sin = np.sin(np.concatenate([f, f], -1))[:, None, :]
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
    return x * cos + rot * sin


class Head:
    def __init__(self, head_dir: str, embed: np.ndarray) -> None:
        with open(os.path.join(head_dir, "config.json")) as f:
            self.c = json.load(f)
        w = td.read_safetensors(os.path.join(head_dir, "model.safetensors"))
        self.w = {k: (v.astype(np.float32) if v.dtype == np.float16 else v)
                  for k, v in w.items()}
        self.ids = np.arange(len(w["d2t"])) + w["d2t"]
        self.embed = embed

    def rows(self, x, y, pos):
        """q, k, v of rows (n, H) with tokens y at positions pos."""
        w, c = self.w, self.c
        eps, nh, nkv, hd = (c["rms_norm_eps"], c["num_attention_heads"],
                            c["num_key_value_heads"], c["head_dim"])
        h = np.concatenate([rms(self.embed[y], w["midlayer.input_layernorm.weight"], eps),
                            rms(x, w["midlayer.hidden_norm.weight"], eps)], -1)
        n = len(x)
        q = (h @ w["midlayer.self_attn.q_proj.weight"].T).reshape(n, nh, hd)
        k = (h @ w["midlayer.self_attn.k_proj.weight"].T).reshape(n, nkv, hd)
        v = (h @ w["midlayer.self_attn.v_proj.weight"].T).reshape(n, nkv, hd)
        return rope(q, pos, c["rope_theta"]), rope(k, pos, c["rope_theta"]), v

    def finish(self, x, q, K, V, mask):
        """The rows' outputs and draft logits; q (n, nh, hd), K/V (m, nkv, hd), mask (n, m)."""
        w, c = self.w, self.c
        nh, nkv, hd, eps = (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                            c["rms_norm_eps"])
        g = np.arange(nh) // (nh // nkv)
        s = np.einsum("nhd,mhd->hnm", q, K[:, g]) / np.sqrt(hd)
        s = np.where(mask[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        att = np.einsum("hnm,mhd->nhd", p, V[:, g]).reshape(len(x), nh * hd)
        o1 = x + att @ w["midlayer.self_attn.o_proj.weight"].T
        n = rms(o1, w["midlayer.post_attention_layernorm.weight"], eps)
        gt = n @ w["midlayer.mlp.gate_proj.weight"].T
        out = o1 + (gt / (1 + np.exp(-gt)) * (n @ w["midlayer.mlp.up_proj.weight"].T)) \
            @ w["midlayer.mlp.down_proj.weight"].T
        return out, rms(out, w["norm.weight"], eps) @ w["lm_head.weight"].T


def check_sequence(head: Head, toks: np.ndarray, feats: np.ndarray, answer: int, depth: int):
    """Accepted drafts (0..depth) for each root row t whose first draft is an answer token."""
    L = len(toks)
    n = L - 1
    x0 = feats[:n].astype(np.float32) @ head.w["fc.weight"].T
    pos = np.arange(n)
    q, K, V = head.rows(x0, toks[1:n + 1], pos)
    out0, lg0 = head.finish(x0, q, K, V, np.tri(n, dtype=bool))
    accepted = []
    for t in range(max(answer - 2, 0), n - 1):   # row t predicts text[t+2]
        x, lg = out0[t:t + 1], lg0[t]
        Kc, Vc = K[:t + 1], V[:t + 1]
        a = 0
        for i in range(depth):
            d = int(head.ids[int(np.argmax(lg))])
            if t + 2 + i >= L or d != int(toks[t + 2 + i]):
                break
            a += 1
            if i == depth - 1:
                break
            qd, kd, vd = head.rows(x, np.array([d]), np.array([t + 1 + i]))
            Kc, Vc = np.concatenate([Kc, kd]), np.concatenate([Vc, vd])
            x, lgs = head.finish(x, qd, Kc, Vc, np.ones((1, len(Kc)), bool))
            lg = lgs[0]
        if t + 2 < L:
            accepted.append(a)
    return accepted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", required=True)
    ap.add_argument("--work", required=True, help="the training work dir (shards, embed.npy)")
    ap.add_argument("--held-out", type=int, default=1,
                    help="as given to training: which shards were held out")
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--max-seqs", type=int, default=0)
    args = ap.parse_args()
    embed = np.load(os.path.join(args.work, "embed.npy"), mmap_mode="r")
    head = Head(args.head, np.asarray(embed, np.float32))
    shards = td.kept_split(args.work, td.list_shards(os.path.join(args.work, "data")),
                           args.held_out)[1]
    acc = []
    n_seqs = 0
    for p in shards:
        if args.max_seqs and n_seqs >= args.max_seqs:
            break
        with open(os.path.join(p, "meta.json")) as f:
            meta = json.load(f)
        sh = td.read_shard(p)
        for s in range(sh.n_seqs):
            if meta["sequences"][s]["temperature"] != 0:
                continue
            q = sh.seq(s)
            acc += check_sequence(head, np.asarray(q["tokens"]), np.asarray(q["feats"]),
                                  q["answer"], args.depth)
            n_seqs += 1
            if args.max_seqs and n_seqs >= args.max_seqs:
                break
    acc = np.array(acc)
    if not len(acc):
        print("no greedy sequence in the held-out shards")
        return 1
    print(f"{n_seqs} greedy sequences, {len(acc)} root positions, depth {args.depth}")
    for i in range(args.depth):
        reach = (acc >= i).sum()
        print(f"  depth {i + 1}: accepted {np.mean(acc >= i + 1):.3f} of roots "
              f"({(acc >= i + 1).sum() / max(reach, 1):.3f} of those that reached it)")
    for k in range(1, args.depth + 1):
        print(f"  chain of {k}: tau = {1 + np.minimum(acc, k).mean():.3f} tokens per verify")
    return 0


if __name__ == "__main__":
    sys.exit(main())
