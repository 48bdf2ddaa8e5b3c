"""The tree rule of speculative sampling in NumPy (csrc/spec/verify.h, sd_verify_tree), twice:

* `verify_tree` — the sample-level twin of the C function: the same walk on the same uniforms,
  with the same float32/float64 arithmetic, so the two agree token for token;
* `exact_emitted` — the exact distribution of what one step emits, by enumerating the draft
  trees a drafter can propose (children drawn without replacement from q, or fixed) and
  weighing each accept/reject branch by its probability: no sampling, no tolerance beyond float
  rounding. `broken` names a deliberately wrong variant of the rule, to show the exactness test
  catches it.

Targets and drafts are functions of the text so far (a tuple of token ids) returning a
distribution over V tokens.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

Dist = Callable[[Tuple[int, ...]], np.ndarray]

#: the wrong rules the exactness test must catch
BROKEN = (
    "keep_rejected_in_q",  # a rejected child stays in q (not removed and renormalised)
    "p_not_residual",      # after a rejection, p stays (not the residual, not p without the child)
    "bonus_from_parent",   # the bonus token is drawn from the last accepted node's parent's p
)


def sample_probs(p: np.ndarray, u: float) -> int:
    """sd_sample_probs: invert the cumulative sum of the positive entries (double sums)."""
    total = 0.0
    for x in p:
        total += float(x)
    target = u * total
    acc, last = 0.0, 0
    for i, x in enumerate(p):
        if x > 0.0:
            last = i
            acc += float(x)
            if acc > target:
                return i
    return last


def _reject(cp, P, cq, Q, t):
    """tree_reject of verify.c: (cp, P, cq, Q) after rejecting token t."""
    if cq is None:
        cp[t] = np.float32(0.0)
    else:
        mass = 0.0
        for i in range(len(cp)):
            a, b = float(cp[i]) / P, float(cq[i]) / Q
            mass += a - b if a > b else 0.0
        if mass > 0.0:
            if P == 1.0 and Q == 1.0:
                r = cp - cq  # float32, as the chain rule
            else:
                r = (cp.astype(np.float64) / P - cq.astype(np.float64) / Q).astype(np.float32)
            cp[:] = np.where(r > 0, r, np.float32(0.0))
        cq[t] = np.float32(0.0)
        Q = sum(float(x) for x in cq)
    P = sum(float(x) for x in cp)
    return P, Q


def verify_tree(tokens: Sequence[int], parent: Sequence[int], p: np.ndarray,
                q: Optional[np.ndarray], u_accept: Sequence[float],
                u_next: Sequence[float]) -> Tuple[List[int], int]:
    """sd_verify_tree: (accepted nodes root to leaf, next token). p (n + 1, V) float32, q (n, V)
    float32 or None."""
    n = len(tokens)
    cp = p[0].astype(np.float32).copy()
    cq = None
    P, node, path = 1.0, -1, []
    while True:
        acc, first, Q = -1, True, 1.0
        for c in range(node + 1, n):
            if parent[c] != node:
                continue
            t = tokens[c]
            if q is not None and first:
                cq = q[c].astype(np.float32).copy()
            first = False
            if P == 1.0 and Q == 1.0:
                qd = float(cq[t]) if q is not None else 1.0
                ok = u_accept[c] * qd < float(cp[t])
            else:
                qt = float(cq[t]) * P if q is not None else P
                pt = float(cp[t]) * Q if q is not None else float(cp[t])
                ok = u_accept[c] * qt < pt
            if ok:
                acc = c
                break
            P, Q = _reject(cp, P, cq if q is not None else None, Q, t)
        if acc < 0:
            return path, sample_probs(cp, u_next[len(path)])
        path.append(acc)
        node = acc
        cp = p[1 + acc].astype(np.float32).copy()
        P = 1.0


# ---- exact distributions -------------------------------------------------------------------

def ordered_samples(q: np.ndarray, b: int):
    """Every ordered draw of b distinct tokens without replacement from q, with its
    probability."""
    for combo in itertools.permutations(range(len(q)), b):
        prob, left = 1.0, 1.0
        for t in combo:
            if left <= 0 or q[t] <= 0:
                prob = 0.0
                break
            prob *= q[t] / left
            left -= q[t]
        if prob > 0:
            yield combo, prob


def exact_emitted(target: Dist, draft: Optional[Dist], guess: Optional[Dist],
                  widths: Sequence[int], prefix: Tuple[int, ...] = (),
                  broken: Optional[str] = None) -> Dict[Tuple[int, ...], float]:
    """The exact distribution of the tokens one step emits after `prefix`, for a tree whose
    nodes at depth d have widths[d] children: drawn without replacement from draft(text)
    (`draft` given), or else the widths[d] most probable tokens of guess(text) (deterministic
    children, ties to the lower id)."""
    out: Dict[Tuple[int, ...], float] = defaultdict(float)
    V = len(target(prefix))
    if not widths:
        for x, px in enumerate(_norm(target(prefix))):
            out[(x,)] += px
        return out
    if draft is not None:
        qd = _norm(draft(prefix))
        realisations = ordered_samples(qd, widths[0])
    else:
        order = sorted(range(V), key=lambda t: (-guess(prefix)[t], t))
        realisations = [(tuple(order[:widths[0]]), 1.0)]
        qd = None
    for children, prob in realisations:
        walk = _walk(target, draft, guess, widths, prefix, children, qd, broken)
        for seq, pr in walk.items():
            out[seq] += prob * pr
    return out


def _walk(target, draft, guess, widths, prefix, children, qd, broken):
    """One node of the walk: its children tried in order (rule of sd_verify_tree)."""
    out: Dict[Tuple[int, ...], float] = defaultdict(float)
    p = _norm(target(prefix))
    q = None if qd is None else qd.copy()
    parent_p = p.copy()
    left = 1.0
    for c in children:
        a = min(1.0, p[c] / q[c]) if q is not None else p[c]
        if a > 0:
            sub = exact_emitted(target, draft, guess, widths[1:], prefix + (c,), broken)
            if broken == "bonus_from_parent" and len(widths) == 1:
                sub = {(x,): px for x, px in enumerate(parent_p)}
            for seq, pr in sub.items():
                out[(c,) + seq] += left * a * pr
        left *= 1.0 - a
        if left <= 0:
            return out
        if q is not None:
            if broken != "p_not_residual":
                r = np.maximum(p - q, 0.0)
                if r.sum() > 0:
                    p = r / r.sum()
            if broken != "keep_rejected_in_q":
                q[c] = 0.0
                q = q / q.sum() if q.sum() > 0 else q  # no child is left to test
        elif broken != "p_not_residual":
            p[c] = 0.0
            p = p / p.sum()
    for x, px in enumerate(p):
        if px > 0:
            out[(x,)] += left * px
    return out


def _norm(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def first_two(emitted: Dict[Tuple[int, ...], float], target: Dist, V: int) -> np.ndarray:
    """P(x1, x2) (V, V) of the text after a step and, when it emitted one token, a plain draw
    from the target (what the next step's exact rule gives)."""
    joint = np.zeros((V, V))
    for seq, pr in emitted.items():
        if len(seq) >= 2:
            joint[seq[0], seq[1]] += pr
        else:
            joint[seq[0]] += pr * _norm(target(seq[:1]))
    return joint


def target_two(target: Dist, V: int) -> np.ndarray:
    """P(x1, x2) of plain sampling from the target."""
    p1 = _norm(target(()))
    return np.array([p1[a] * _norm(target((a,))) for a in range(V)])
