"""Training an EAGLE-3 head with PyTorch (``pip install specdec[train]``); torch is imported
only when a function here runs.

The head is the published EAGLE-3 draft layer (Li et al. 2025, "EAGLE-3"; its layout as in
SafeAILab/EAGLE ``eagle/model/cnets.py`` and SpecForge ``specforge/modeling/draft/
llama3_eagle.py``, which were read to learn the method, not copied). For a row at position t
of the real text, with features a_low/a_mid/a_high (the target's residual stream entering
layers 2, L//2, L-3 at t) and token y = text[t+1]:

    x   = fc(cat(a_low, a_mid, a_high))                  real-text rows
    x   = the head's own pre-norm output of the parent   drafted rows
    h   = cat(rmsnorm(embed(y), input_layernorm), rmsnorm(x, hidden_norm))      (2H)
    o1  = x + o_proj(attention(q(h), k(h), v(h)))   RoPE at the row's position, GQA, causal
    out = o1 + down(silu(gate(n)) * up(n)),  n = rmsnorm(o1, post_attention_layernorm)
    logits over the draft vocabulary = lm_head(rmsnorm(out, norm)); the row predicts text[t+2]

RoPE is Hugging Face LlamaAttention's: ``rotate_half`` pairs element i of a head with element
i + head_dim/2 (the pairing llama.cpp calls NEOX; HF's Llama checkpoints keep it, where
llama.cpp's GGUF converter permutes q/k rows to pair neighbours instead), inv_freq =
theta^(-2i/head_dim). Query head h reads KV head h // (n_heads / n_kv_heads) (HF repeat_kv).

Training-time test (EAGLE-3's "TTT", as SpecForge's OnlineEagle3Model runs it): step 0 is the
rows of the real text; step i (1..K-1) feeds each row's step i-1 output back as x, with the
real token text[t+1+i] as y, at position t+i, predicting text[t+2+i]. A step-i row attends to
the step-0 rows at positions <= t (the context the head saw) and to its own row of each step
1..i (its drafted ancestors and itself) -- exactly what a chain drafted i tokens deep sees at
inference. Losses are weighted 0.8**i. Labels are the target's distribution at the predicted
position restricted to the draft vocabulary (from its top-k logits; a position counts only
when the target's argmax lies in the draft vocabulary, as SpecForge does).
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import time
from typing import Dict, List, Sequence

import numpy as np

from . import train_data as td

TTT_DECAY = 0.8


def require_torch():
    """torch, or an ImportError that says how to install it."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("training draft heads needs PyTorch, which specdec itself does not: "
                          "pip install specdec[train]  (or: pip install torch)") from e
    return torch


def build_head(cfg: Dict):
    """The head as a torch module for an EAGLE-3 ``config.json`` dict (float32, CPU)."""
    torch = require_torch()
    nn = torch.nn
    F_ = torch.nn.functional
    H, nh, nkv, hd = (cfg["hidden_size"], cfg["num_attention_heads"],
                      cfg["num_key_value_heads"], cfg["head_dim"])
    F, Vd, eps = cfg["intermediate_size"], cfg["draft_vocab_size"], cfg["rms_norm_eps"]
    theta = cfg["rope_theta"]

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3 * H, H, bias=False)
            self.input_layernorm = RMSNorm()
            self.hidden_norm = RMSNorm()
            self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
            self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
            self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
            self.o_proj = nn.Linear(nh * hd, H, bias=False)
            self.post_attention_layernorm = RMSNorm()
            self.gate_proj = nn.Linear(H, F, bias=False)
            self.up_proj = nn.Linear(H, F, bias=False)
            self.down_proj = nn.Linear(F, H, bias=False)
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(H, Vd, bias=False)
            inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            self.register_buffer("inv_freq", inv.float(), persistent=False)

        def rope(self, x, pos):
            # x (B, heads, T, hd), pos (T,) -- HF rotate_half: pairs (i, i + hd/2)
            f = pos.float()[:, None] * self.inv_freq[None, :]
            emb = torch.cat([f, f], dim=-1)
            cos, sin = emb.cos(), emb.sin()
            x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin

        def layer(self, emb, x, pos, kv_cache: List):
            """One step of rows: emb, x (B, T, H); pos (T,) positions. ``kv_cache`` holds the
            (k, v) of earlier steps: [0] is the causal context, the others are diagonal. Returns
            the pre-norm output (B, T, H) and appends this step's (k, v)."""
            B, T, _ = x.shape
            h = torch.cat([self.input_layernorm(emb), self.hidden_norm(x)], dim=-1)
            q = self.q_proj(h).view(B, T, nh, hd).transpose(1, 2)
            k = self.k_proj(h).view(B, T, nkv, hd).transpose(1, 2)
            v = self.v_proj(h).view(B, T, nkv, hd).transpose(1, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            rep = nh // nkv
            k = k.repeat_interleave(rep, dim=1)  # query head j reads kv head j // rep
            v = v.repeat_interleave(rep, dim=1)
            kv_cache.append((k, v))
            scale = 1.0 / math.sqrt(hd)
            k0, v0 = kv_cache[0]
            s0 = torch.matmul(q, k0.transpose(-1, -2)) * scale        # (B, nh, T, T)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag = [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in kv_cache[1:]]
            p = torch.softmax(torch.cat([s0] + diag, dim=-1), dim=-1)
            att = torch.matmul(p[..., :T], v0)
            for j, (_, vj) in enumerate(kv_cache[1:]):
                att = att + p[..., T + j:T + j + 1] * vj
            att = att.transpose(1, 2).reshape(B, T, nh * hd)
            o1 = x + self.o_proj(att)
            n = self.post_attention_layernorm(o1)
            return o1 + self.down_proj(F_.silu(self.gate_proj(n)) * self.up_proj(n))

        def logits(self, out):
            return self.lm_head(self.norm(out))

    return Head()


# Module parameter -> published EAGLE-3 tensor name.
EXPORT_NAMES = {
    "fc.weight": "fc.weight",
    "input_layernorm.weight": "midlayer.input_layernorm.weight",
    "hidden_norm.weight": "midlayer.hidden_norm.weight",
    "q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "up_proj.weight": "midlayer.mlp.up_proj.weight",
    "down_proj.weight": "midlayer.mlp.down_proj.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


# ---------------------------------------------------------------------------------------------
# Batches

class Batches:
    """Sequences from shards, cut to windows of ``max_len`` rows that keep their answers, as
    padded NumPy batches."""

    def __init__(self, shard_paths: Sequence[str], max_len: int, ttt: int,
                 target_to_draft: np.ndarray) -> None:
        self.shards = [td.read_shard(p) for p in shard_paths]
        self.index = [(i, s) for i, sh in enumerate(self.shards) for s in range(sh.n_seqs)]
        self.max_len, self.ttt, self.t2d_idx = max_len, ttt, target_to_draft

    def __len__(self) -> int:
        return len(self.index)

    def make(self, items: Sequence[int]) -> Dict[str, np.ndarray]:
        seqs = [self.shards[i].seq(s) for i, s in (self.index[j] for j in items)]
        K = self.ttt
        T = min(self.max_len, max(len(q["tokens"]) - 1 for q in seqs))
        B = len(seqs)
        kt = seqs[0]["topk_ids"].shape[1]
        feats = np.zeros((B, T, seqs[0]["feats"].shape[1]), np.float32)
        ytok = np.zeros((B, T + K), np.int64)      # ytok[b, t + i]: the token row t reads at
        lab_ids = np.full((B, T + K, kt), -1, np.int64)  # step i, and the labels it predicts
        lab_val = np.zeros((B, T + K, kt), np.float32)
        valid = np.zeros((B, T + K), bool)
        for b, q in enumerate(seqs):
            toks = np.asarray(q["tokens"])
            L = len(toks)
            # a sequence of more than T rows keeps a window of T: the one that ends with it, or
            # when its answer is longer, the one its answer starts (a window is what the head
            # sees at inference with a sliding window; the rotary positions are relative)
            s = max(0, min(q["answer"] - 1, L - 1 - T))
            n = min(T, L - 1 - s)                  # rows t = 0..n-1 have y = text[s+t+1]
            feats[b, :n] = q["feats"][s:s + n]
            m = min(T + K, L - 1 - s)
            ytok[b, :m] = toks[1 + s:1 + s + m]
            # step i row t predicts from target row p = s + t + 1 + i, i.e. index t + i here
            lab_ids[b, :m] = q["topk_ids"][1 + s:1 + s + m]
            lab_val[b, :m] = q["topk_logits"][1 + s:1 + s + m]
            p = np.arange(1 + s, 1 + s + m)
            valid[b, :m] = (p >= q["answer"] - 1) & (p <= L - 2)
        draft = np.where(lab_ids >= 0, self.t2d_idx[np.maximum(lab_ids, 0)], -1)
        inans = valid.copy()                       # rows that predict an answer token
        valid &= draft[:, :, 0] >= 0               # ... whose target argmax is in the vocab
        return {"feats": feats, "ytok": ytok, "draft": draft, "lab_val": lab_val,
                "valid": valid, "inans": inans, "argmax": lab_ids[:, :, 0]}


def run_steps(torch, head, embed, batch: Dict, ttt: int, d2t_ids):
    """The TTT unroll over one batch. Per step i: (summed loss, rows whose draft argmax is the
    target's argmax, rows counted (target argmax in the draft vocabulary), rows whose steps
    0..i all predict the target's argmax, rows where steps 0..i all predict answer tokens).
    The last two give a chain's acceptance i + 1 deep at temperature 0 (out-of-vocabulary
    argmaxes count as misses there). ``embed``: the target's embedding table (V, H)."""
    feats = torch.from_numpy(batch["feats"])
    B, T, _ = feats.shape
    x = head.fc(feats)
    kv: List = []
    out = []
    chain_ok = chain_n = None
    inans = torch.from_numpy(batch["inans"])
    valid0 = torch.from_numpy(batch["valid"])
    draft = torch.from_numpy(batch["draft"])
    lab_val = torch.from_numpy(batch["lab_val"])
    argmax = torch.from_numpy(batch["argmax"])
    ytok = torch.from_numpy(batch["ytok"])
    for i in range(ttt):
        pos = torch.arange(i, T + i)
        emb = embed[ytok[:, i:i + T]]
        x = head.layer(emb, x, pos, kv)
        valid = valid0[:, i:i + T]
        rows = x[valid]                            # only rows with a label reach lm_head
        lg = torch.log_softmax(head.logits(rows).float(), dim=-1)
        d = draft[:, i:i + T][valid]               # (N, k) draft ids, -1 outside the vocab
        lv = lab_val[:, i:i + T][valid].masked_fill(d < 0, float("-inf"))
        p = torch.softmax(lv, dim=-1)              # target over its top-k in the draft vocab
        loss = -(p * lg.gather(1, d.clamp(min=0))).sum(-1)
        pred = d2t_ids[lg.argmax(-1)]
        ok = pred == argmax[:, i:i + T][valid]
        full = torch.zeros(B, T, dtype=torch.bool)
        full[valid] = ok
        # row t at step i drafts the (i+1)-th token of the chain rooted at row t
        m = inans[:, i:i + T]
        chain_ok = full if chain_ok is None else chain_ok & full
        chain_n = m if chain_n is None else chain_n & m
        out.append((loss.sum(), int(ok.sum()), int(valid.sum()),
                    int((chain_ok & chain_n).sum()), int(chain_n.sum())))
    return out


# ---------------------------------------------------------------------------------------------
# Training loop

def _ckpts(work: str) -> List[str]:
    return sorted(glob.glob(os.path.join(work, "ckpt", "step_*.pt")))


def _trim_log(path: str, step: int) -> None:
    """Keep the header and the rows of steps <= ``step`` in the CSV at ``path``: a fresh start
    (step 0) drops an earlier run's rows, a resume those logged after its checkpoint."""
    if not os.path.exists(path):
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    keep = rows[:1] + [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= step]
    if len(keep) == len(rows):
        return
    with open(path + ".tmp", "w", newline="") as f:
        csv.writer(f).writerows(keep)
    os.replace(path + ".tmp", path)


def export_head(torch, head, cfg: Dict, d2t: np.ndarray, t2d: np.ndarray, out: str) -> None:
    sd = head.state_dict()
    w = {EXPORT_NAMES[k]: sd[k].detach().float().numpy() for k in EXPORT_NAMES}
    w["d2t"], w["t2d"] = d2t, t2d
    td.export_eagle3(out, w, cfg)


def _load_cfg(work: str, args_intermediate: int, vd: int) -> Dict:
    with open(os.path.join(work, "target_config.json")) as f:
        cfg = json.load(f)
    cfg["intermediate_size"] = int(args_intermediate)
    cfg["draft_vocab_size"] = int(vd)
    return cfg


def evaluate(torch, head, embed, batches: Batches, ttt: int, d2t_ids, bs: int) -> Dict:
    head.eval()
    tot = np.zeros((ttt, 5))
    with torch.no_grad():
        for a in range(0, len(batches), bs):
            res = run_steps(torch, head, embed, batches.make(range(a, min(len(batches), a + bs))),
                            ttt, d2t_ids)
            for i, r in enumerate(res):
                tot[i] += (float(r[0]),) + tuple(r[1:])
    head.train()
    n = np.maximum(tot[:, 2], 1)
    return {"loss": list(tot[:, 0] / n), "acc": list(tot[:, 1] / n),
            "chain": list(tot[:, 3] / np.maximum(tot[:, 4], 1)),
            "n": list(tot[:, 2].astype(int))}


def train(work: str, out: str, args) -> None:
    """Train (or resume) the head on the shards under ``work``; see ``specdec.train``."""
    torch = require_torch()
    from tqdm import tqdm

    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    voc = np.load(os.path.join(work, "vocab.npz"))
    ids, d2t, t2d = voc["ids"], voc["d2t"], voc["t2d"]
    cfg = _load_cfg(work, args.intermediate_size, len(ids))
    tgt2draft = np.full(len(t2d), -1, np.int64)
    tgt2draft[ids] = np.arange(len(ids))
    embed = torch.from_numpy(np.load(os.path.join(work, "embed.npy")).astype(np.float32))
    shards = td.list_shards(os.path.join(work, "data"))
    train_sh, held_sh = td.kept_split(work, shards, args.held_out)
    train_b = Batches(train_sh, args.max_len, args.ttt, tgt2draft)
    eval_b = Batches(held_sh, args.max_len, args.ttt, tgt2draft) if held_sh else None
    d2t_ids = torch.from_numpy(ids)

    head = build_head(cfg)
    with torch.no_grad():  # start lm_head from the target's (tied) output rows of the vocab
        head.lm_head.weight.copy_(embed[torch.from_numpy(ids)])
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step = 0
    ck = _ckpts(work)
    if ck:
        state = torch.load(ck[-1], map_location="cpu")
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        print(f"resumed from {ck[-1]} at step {step}", flush=True)
    os.makedirs(os.path.join(work, "ckpt"), exist_ok=True)

    def lr_at(s: int) -> float:
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        frac = (s - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    log_path = os.path.join(work, "train_log.csv")
    eval_path = os.path.join(work, "eval_log.csv")
    _trim_log(log_path, step)
    _trim_log(eval_path, step if step else -1)  # a fresh start evaluates step 0 again
    new_log = not os.path.exists(log_path)
    logf = open(log_path, "a", newline="")
    log = csv.writer(logf)
    if new_log:
        log.writerow(["step", "time", "lr", "loss"] + [f"loss{i}" for i in range(args.ttt)]
                     + [f"acc{i}" for i in range(args.ttt)] + ["rows", "seconds"])
    rng = np.random.default_rng(args.seed + step)
    perm = rng.permutation(len(train_b))
    cursor = 0
    print(f"training on {len(train_b)} sequences ({len(train_sh)} shards), held out "
          f"{len(eval_b) if eval_b else 0}; Vd {len(ids)}, TTT {args.ttt}", flush=True)

    def save_and_export(s: int) -> None:
        path = os.path.join(work, "ckpt", f"step_{s:06d}.pt")
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": s,
                    "cfg": cfg}, path + ".tmp")
        os.replace(path + ".tmp", path)
        for old in _ckpts(work)[:-2]:
            os.remove(old)
        export_head(torch, head, cfg, d2t, t2d, out)

    def run_eval(s: int) -> None:
        if eval_b is None:
            return
        r = evaluate(torch, head, embed, eval_b, args.ttt, d2t_ids, args.batch)
        new = not os.path.exists(eval_path)
        with open(eval_path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["step"] + [f"loss{i}" for i in range(args.ttt)]
                           + [f"acc{i}" for i in range(args.ttt)]
                           + [f"chain{i}" for i in range(args.ttt)] + ["rows0"])
            w.writerow([s] + [f"{v:.4f}" for v in r["loss"] + r["acc"] + r["chain"]]
                       + [r["n"][0]])
        print(f"eval step {s}: acc " + " ".join(f"{a:.3f}" for a in r["acc"]) + " chain "
              + " ".join(f"{a:.3f}" for a in r["chain"]), flush=True)

    if step == 0:
        run_eval(0)
    bar = tqdm(total=args.steps, initial=step, desc="train", unit="step")
    while step < args.steps:
        if cursor + args.batch > len(perm):
            perm, cursor = rng.permutation(len(train_b)), 0
        items = perm[cursor:cursor + args.batch]
        cursor += args.batch
        t0 = time.time()
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        res = run_steps(torch, head, embed, train_b.make(items), args.ttt, d2t_ids)
        n0 = max(res[0][2], 1)
        loss = sum(TTT_DECAY ** i * r[0] / max(r[2], 1) for i, r in enumerate(res))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        opt.step()
        step += 1
        dt = time.time() - t0
        parts = [float(r[0].detach()) / max(r[2], 1) for r in res]
        accs = [r[1] / max(r[2], 1) for r in res]
        log.writerow([step, f"{time.time():.0f}", f"{lr:.3g}", f"{float(loss.detach()):.4f}"]
                     + [f"{v:.4f}" for v in parts] + [f"{v:.4f}" for v in accs]
                     + [n0, f"{dt:.2f}"])
        logf.flush()
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", acc0=f"{accs[0]:.3f}",
                        accL=f"{accs[-1]:.3f}", s=f"{dt:.1f}")
        if step % args.ckpt_every == 0 or step == args.steps:
            save_and_export(step)
        if step % args.eval_every == 0 or step == args.steps:
            run_eval(step)
    bar.close()
    logf.close()
    if not _ckpts(work) or not os.path.exists(os.path.join(out, "model.safetensors")):
        save_and_export(step)


def export_latest(work: str, out: str) -> None:
    """Export the latest checkpoint under ``work`` to ``out``."""
    torch = require_torch()
    ck = _ckpts(work)
    if not ck:
        raise FileNotFoundError(f"no checkpoint under {os.path.join(work, 'ckpt')}")
    state = torch.load(ck[-1], map_location="cpu")
    cfg = state["cfg"]
    voc = np.load(os.path.join(work, "vocab.npz"))
    head = build_head(cfg)
    head.load_state_dict(state["head"])
    export_head(torch, head, cfg, voc["d2t"], voc["t2d"], out)
    print(f"exported step {state['step']} to {out}", flush=True)
