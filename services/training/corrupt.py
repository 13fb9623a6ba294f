"""Training-instance builders for the drafters.

Convention (the decode engine relies on it): the output AT a mask token predicts the token at that mask's
own logical position (no shift); the output at a clean token predicts the next logical token.
Position ids are always the original logical positions, and an explicit attention mask is always passed
(transformers 5 otherwise reads non-monotonic position ids as packed sequences): 4D for causal drafters.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from services.training.dataset import Example
from services.training.train_loop import Batch

ARM, MDM = 1, 2  # kinds of labelled positions


@dataclass(slots=True)
class Instance:
    ids: list[int]  # physical order
    pos: list[int]  # logical position of each physical token
    labels: list[int]  # -100 = no loss
    kind: list[int]  # 0 none, ARM, MDM
    t: float  # masking ratio that produced it
    n_prompt: int  # leading clean, in-order tokens (dual stream: the whole memory stream)
    slot_size: int = 1  # k of the hybrid sample; 1 for token-level samples
    block: list[int] | None = None  # dual stream: logical start of each token's prediction block, -1 = memory
    inv_gamma: list[float] | None = None  # dual stream: 1 / masking ratio of each token's block


def _split(e: Example, rng: random.Random, eos_id: int, eos_pad_max: int) -> tuple[list[int], list[int]]:
    """(prompt, response); plain text gets a random prompt cut; response gets 0..eos_pad_max extra eos."""
    n_p = e.n_prompt if e.n_prompt > 0 else rng.randint(1, max(1, len(e.ids) // 2))
    return e.ids[:n_p], e.ids[n_p:] + [eos_id] * rng.randint(0, eos_pad_max)


def hybrid(
    e: Example, rng: random.Random, mask_id: int, eos_id: int, slot_sizes: list[int], eos_pad_max: int = 0
) -> Instance:
    """ReFusion 4.3: floor(tK) slots masked; clean slots permuted first, masked slots after in order."""
    p, r = _split(e, rng, eos_id, eos_pad_max)
    k = rng.choice(slot_sizes)
    K = math.ceil(len(r) / k)
    t = rng.random()
    masked = set(rng.sample(range(K), math.floor(t * K)))
    clean = [s for s in range(K) if s not in masked]
    rng.shuffle(clean)
    ids, pos, labels, kind = list(p), list(range(len(p))), [-100] * len(p), [0] * len(p)
    for s in clean:
        toks = r[s * k : (s + 1) * k]
        ids += toks
        pos += [len(p) + s * k + j for j in range(len(toks))]
        labels += toks[1:] + [-100]  # j = 2..k: next token inside the same slot
        kind += [ARM] * (len(toks) - 1) + [0]
    for s in sorted(masked):
        toks = r[s * k : (s + 1) * k]
        ids += [mask_id] * len(toks)
        pos += [len(p) + s * k + j for j in range(len(toks))]
        labels += toks  # no shift
        kind += [MDM] * len(toks)
    return Instance(ids, pos, labels, kind, t, len(p), k)


def token_reorder(e: Example, rng: random.Random, mask_id: int, eos_id: int, eos_pad_max: int = 0) -> Instance:
    """WeDLM 4.1: response tokens masked with prob t; observed first (in order), masks after."""
    p, r = _split(e, rng, eos_id, eos_pad_max)
    t = rng.random()
    m = [rng.random() < t for _ in r]
    if not any(m):
        m[rng.randrange(len(r))] = True
    obs = [i for i in range(len(r)) if not m[i]]
    msk = [i for i in range(len(r)) if m[i]]
    ids, pos, labels, kind = list(p), list(range(len(p))), [-100] * len(p), [0] * len(p)
    for i in obs:
        ids.append(r[i])
        pos.append(len(p) + i)
        nxt = i + 1 < len(r) and not m[i + 1]  # next logical token observed = physically next: plain AR
        labels.append(r[i + 1] if nxt else -100)
        kind.append(ARM if nxt else 0)
    for i in msk:
        ids.append(mask_id)
        pos.append(len(p) + i)
        labels.append(r[i])
        kind.append(MDM)
    return Instance(ids, pos, labels, kind, t, len(p))


def dual_stream(
    e: Example, rng: random.Random, mask_id: int, eos_id: int, block_size: int, eos_pad_max: int = 0
) -> Instance:
    """WeDLM 4.2: clean memory stream (prompt + response, AR labels) then a prediction stream over the response,
    cut into blocks (first one of random length) each masked with ratio gamma ~ U(0, 1] and reordered within.
    A prediction token sees memory before its block and its own block causally (mask built by `collate`)."""
    p, r = _split(e, rng, eos_id, eos_pad_max)
    n_p, mem = len(p), p + r
    ids, pos = list(mem), list(range(len(mem)))
    labels = [-100] * (n_p - 1) + r + [-100]
    kind = [0] * (n_p - 1) + [ARM] * len(r) + [0]
    block, inv_gamma = [-1] * len(mem), [0.0] * len(mem)
    a = 0
    while a < len(r):
        b = min(len(r), a + (rng.randint(1, block_size) if a == 0 else block_size))
        gamma = 1.0 - rng.random()  # (0, 1]
        m = [rng.random() < gamma for _ in range(a, b)]
        if not any(m):
            m[rng.randrange(b - a)] = True
        order = [i for i in range(a, b) if not m[i - a]] + [i for i in range(a, b) if m[i - a]]
        for i in order:
            masked = m[i - a]
            ids.append(mask_id if masked else r[i])
            pos.append(n_p + i)
            labels.append(r[i] if masked else -100)
            kind.append(MDM if masked else 0)
            block.append(n_p + a)
            inv_gamma.append(1.0 / gamma)
        a = b
    return Instance(ids, pos, labels, kind, 1.0, len(mem), block=block, inv_gamma=inv_gamma)


def visible(x: Instance) -> torch.Tensor:
    """[n, n] bool: causal, and for dual stream each prediction block sees only earlier memory and itself."""
    n = len(x.ids)
    vis = torch.ones(n, n, dtype=torch.bool).tril()
    if x.block is None:
        return vis
    blk, pos = torch.tensor(x.block), torch.tensor(x.pos)
    mem = blk == -1
    own = blk[:, None] == blk[None, :]
    before = mem[None, :] & (pos[None, :] < blk[:, None])
    return vis & torch.where(mem[:, None], mem[None, :], own | before)


def bidirectional(
    e: Example, rng: random.Random, mask_id: int, eos_id: int, eos_pad_max: int = 0, eps: float = 1e-3
) -> Instance:
    """LLaDA: each response token masked with prob t (>= eps); order and positions untouched."""
    p, r = _split(e, rng, eos_id, eos_pad_max)
    t = (1 - eps) * rng.random() + eps
    m = [rng.random() < t for _ in r]
    if not any(m):
        m[rng.randrange(len(r))] = True
    ids = p + [mask_id if mi else x for x, mi in zip(r, m, strict=True)]
    labels = [-100] * len(p) + [x if mi else -100 for x, mi in zip(r, m, strict=True)]
    kind = [0] * len(p) + [MDM if mi else 0 for mi in m]
    return Instance(ids, list(range(len(ids))), labels, kind, t, len(p))


def collate(insts: list[Instance], mode: str, mdm_weight: float = 1.0, pad_id: int = 0) -> Batch:
    """mode 'hybrid': loss = mean ARM ce + mdm_weight * mean MDM ce;
    mode 'dual': loss = mean ARM ce + mdm_weight * sum(ce / gamma) over masked / prediction-stream tokens (002 Eq. 10);
    mode 'mdm': loss = sum(ce / t) over masked / number of response tokens (LLaDA).
    Causal batches get a [B, 1, T, T] mask (dual stream's block pattern, pads hidden); 'mdm' a [B, T] one."""
    B, T = len(insts), max(len(x.ids) for x in insts)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    vis = torch.eye(T, dtype=torch.bool).repeat(B, 1, 1, 1)  # [B, 1, T, T] pads see themselves only
    labels = torch.full((B, T), -100, dtype=torch.long)
    kind = torch.zeros((B, T), dtype=torch.long)
    inv_t = torch.zeros((B, T))
    for i, x in enumerate(insts):
        n = len(x.ids)
        ids[i, :n], pos[i, :n], labels[i, :n] = torch.tensor(x.ids), torch.tensor(x.pos), torch.tensor(x.labels)
        kind[i, :n] = torch.tensor(x.kind)
        attn[i, :n] = 1
        vis[i, 0, :n, :n] = visible(x)
        inv_t[i, :n] = torch.tensor(x.inv_gamma) if x.inv_gamma else (1.0 / x.t if x.t > 0 else 0.0)
    if T > 0:
        pos[attn == 0] = pos.max() + 1  # pads: any position, they are masked out
    n_arm, n_mdm = int((kind == ARM).sum()), int((kind == MDM).sum())
    n_resp = max(1, sum(len(x.ids) - x.n_prompt for x in insts))
    arm = (kind == ARM).float() / max(1, n_arm)
    if mode == "hybrid":
        w = arm + mdm_weight * (kind == MDM).float() / max(1, n_mdm)
    elif mode == "dual":
        w = arm + mdm_weight * (kind == MDM).float() * inv_t / n_resp
    elif mode == "mdm":
        return Batch(ids, pos, attn, labels, (kind == MDM).float() * inv_t / n_resp)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return Batch(ids, pos, vis, labels, w)
