"""Shared training loop: config, model build/init, AdamW + cosine, bf16 autocast, tqdm, resumable
checkpoints, held-out loss, self-contained save (weights + tokenizer). Objectives plug in as a
`make_batch(examples, rng) -> Batch` function; loss = sum(ce * weight) over labelled positions.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from tqdm import tqdm
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from services.training import dataset
from services.training.grow import grow

OBJECTIVES = ("ar", "hybrid", "mdm")


@dataclass(slots=True)
class TrainConfig:
    name: str
    objective: str = "ar"
    out: str = ""  # default models/<name>
    run_dir: str = ""  # default runs/<name>
    data: str = "data"
    tokenizer: str = "models/tokenizer"
    init_from: str | None = None
    grow_from: str | None = None  # a smaller Qwen3 to grow function-preservingly into `model` (grow.py)
    model: dict = field(default_factory=dict)  # Qwen3Config kwargs (ignored with init_from)
    steps: int = 1000
    batch_tokens: int = 4096
    max_len: int = 160
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    corpus_frac: float = 0.1
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"  # compute dtype: float32 | bfloat16 (autocast)
    save_dtype: str = "auto"  # auto: float32 if it fits max_mb else float16
    max_mb: float = 24.0
    threads: int = 2
    ckpt_every: int = 200
    eval_every: int = 200
    eval_batches: int = 8
    # drafter objectives
    slot_sizes: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    mdm_weight: float = 1.0  # lambda in L_ARM + lambda * L_MDM
    token_reorder_frac: float = 0.0  # share of WeDLM token-level topological-reordering samples
    dual_stream_frac: float = 0.0  # share of WeDLM 4.2 dual-stream batches (memory + block-masked prediction stream)
    dual_block_size: int = 16  # their block size B (002 uses 32; 16 matches the pipeline's window)
    eos_pad_max: int = 8  # extra eos appended to drafter responses (learn to stop inside a canvas)
    family_weights: dict = field(default_factory=dict)  # family -> integer repeat of its train items (default 1)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}")
        if self.dtype not in ("float32", "bfloat16") or self.save_dtype not in ("auto", "float32", "float16"):
            raise ValueError("bad dtype/save_dtype")
        if self.steps <= 0 or self.batch_tokens < self.max_len or not 0 <= self.corpus_frac <= 1:
            raise ValueError("steps > 0, batch_tokens >= max_len, corpus_frac in [0, 1]")
        if not all(isinstance(w, int) and w >= 0 for w in self.family_weights.values()):
            raise ValueError("family_weights must be non-negative integers")
        if not all(k > 0 for k in self.slot_sizes) or not 0 <= self.token_reorder_frac <= 1:
            raise ValueError("bad slot_sizes / token_reorder_frac")
        if not 0 <= self.dual_stream_frac <= 1 or self.dual_block_size < 1:
            raise ValueError("dual_stream_frac must be in [0, 1] and dual_block_size >= 1")
        if self.init_from and self.grow_from:
            raise ValueError("init_from and grow_from are exclusive: start from one checkpoint")
        self.out = self.out or f"models/{self.name}"
        self.run_dir = self.run_dir or f"runs/{self.name}"

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> TrainConfig:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        known = {f.name for f in fields(cls)}
        if unknown := set(raw) - known:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**raw)


@dataclass(slots=True)
class Batch:
    input_ids: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T] logical positions
    attention_mask: torch.Tensor  # [B, T] 1 = real token, 0 = pad; or [B, 1, T, T] bool, True = attend
    labels: torch.Tensor  # [B, T] target read from the output AT this position, -100 = none
    weights: torch.Tensor  # [B, T] loss = sum(ce * weights)

    def to(self, device: str) -> Batch:
        return Batch(
            *(getattr(self, f).to(device) for f in ("input_ids", "position_ids", "attention_mask", "labels", "weights"))
        )


MakeBatch = Callable[[list[dataset.Example], random.Random], Batch]


def build_model(cfg: TrainConfig, tok, **extra) -> Qwen3ForCausalLM:
    if cfg.init_from:
        model = Qwen3ForCausalLM.from_pretrained(cfg.init_from, dtype=torch.float32)
        for k, v in extra.items():
            setattr(model.config, k, v)
    else:
        kw = dict(
            vocab_size=len(tok),
            tie_word_embeddings=True,
            max_position_embeddings=512,
            bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        kw.update(cfg.model)
        kw.update(extra)
        torch.manual_seed(cfg.seed)
        if cfg.grow_from:
            small = Qwen3ForCausalLM.from_pretrained(cfg.grow_from, dtype=torch.float32)
            model = grow(small, Qwen3Config(**kw), seed=cfg.seed)
        else:
            model = Qwen3ForCausalLM(Qwen3Config(**kw))
    model.config.use_cache = False
    return model


def losses(model, b: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(weighted loss, summed plain ce, n labelled); lm_head only on labelled positions."""
    h = model.model(
        input_ids=b.input_ids, position_ids=b.position_ids, attention_mask=b.attention_mask
    ).last_hidden_state
    sel = b.labels != -100
    logits = model.lm_head(h[sel]).float()  # [N, V]
    ce = F.cross_entropy(logits, b.labels[sel], reduction="none")
    return (ce * b.weights[sel]).sum(), ce.detach().sum(), int(sel.sum())


def _lr(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def _examples(cfg: TrainConfig, tok, split: str) -> tuple[list[dataset.Example], list[dataset.Example]]:
    t = dataset.encode_tasks(tok, dataset.load_tasks(cfg.data, split), cfg.max_len)
    c = dataset.encode_corpus(tok, dataset.load_corpus(cfg.data, split), cfg.max_len) if cfg.corpus_frac else []
    return t, c


@torch.no_grad()
def evaluate(model, cfg: TrainConfig, batches: list[list[dataset.Example]], make: MakeBatch) -> float:
    """Mean plain cross-entropy per labelled token (fixed rng, so comparable across steps)."""
    model.eval()
    rng = random.Random(cfg.seed + 1)
    tot, n = 0.0, 0
    for ex in batches:
        with _autocast(cfg):
            _, ce, k = losses(model, make(ex, rng).to(cfg.device))
        tot, n = tot + float(ce), n + k
    model.train()
    return tot / max(1, n)


def _autocast(cfg: TrainConfig):
    dev = "cuda" if cfg.device.startswith("cuda") else "cpu"
    return torch.autocast(dev, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16")


def train(cfg: TrainConfig, make: MakeBatch, resume: bool = False, **config_extra) -> dict:
    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run, out = Path(cfg.run_dir), Path(cfg.out)
    run.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(cfg.tokenizer, local_files_only=True)
    model = build_model(cfg, tok, **config_extra).to(cfg.device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    tasks_tr, corpus_tr = _examples(cfg, tok, "train")
    tasks_tr = [e for e in tasks_tr for _ in range(cfg.family_weights.get(e.family, 1))]
    tasks_ho, corpus_ho = _examples(cfg, tok, "heldout")
    task_sampler = dataset.Sampler(tasks_tr, cfg.batch_tokens, cfg.seed)
    corpus_sampler = dataset.Sampler(corpus_tr, cfg.batch_tokens, cfg.seed + 7) if corpus_tr else None
    ho_tasks = dataset.fixed_batches(tasks_ho, cfg.batch_tokens)
    ho_tasks = ho_tasks[:: max(1, len(ho_tasks) // cfg.eval_batches)][: cfg.eval_batches]
    ho_corpus = dataset.fixed_batches(corpus_ho[:256], cfg.batch_tokens)[:2]

    source = cfg.init_from or cfg.grow_from
    prev = Path(source or "") / "train_summary.json"
    parent = _lineage(prev) if source and prev.exists() else None
    step, elapsed, ckpt = 0, 0.0, run / "ckpt.pt"
    if resume and ckpt.exists():
        state = torch.load(ckpt, map_location=cfg.device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed = state["step"], state["elapsed"]
    log = (run / "log.jsonl").open("a")
    model.train()
    t0 = time.time() - elapsed
    bar = tqdm(range(step, cfg.steps), initial=step, total=cfg.steps, desc=cfg.name, mininterval=10)
    ema = None
    for step in bar:
        rng = random.Random(f"{cfg.seed}/mask/{step}")
        use_corpus = corpus_sampler is not None and rng.random() < cfg.corpus_frac
        ex = (corpus_sampler if use_corpus else task_sampler).batch(step)  # type: ignore[union-attr]
        b = make(ex, rng).to(cfg.device)
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step)
        with _autocast(cfg):
            loss, ce, n = losses(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        cur = float(ce) / max(1, n)
        ema = cur if ema is None else 0.95 * ema + 0.05 * cur
        bar.set_postfix(ce=f"{ema:.3f}", lr=f"{_lr(cfg, step):.1e}", refresh=False)
        done = step + 1
        rec: dict[str, object] = {
            "step": done,
            "ce": round(cur, 4),
            "corpus": use_corpus,
            "t": round(time.time() - t0, 1),
        }
        if done % cfg.eval_every == 0 or done == cfg.steps:
            rec["heldout_task_ce"] = round(evaluate(model, cfg, ho_tasks, make), 4)
            if ho_corpus:
                rec["heldout_text_ce"] = round(evaluate(model, cfg, ho_corpus, make), 4)
            tqdm.write(json.dumps(rec))
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if done % cfg.ckpt_every == 0 or done == cfg.steps:
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": done, "elapsed": time.time() - t0}
            torch.save(state, ckpt.with_suffix(".tmp"))
            ckpt.with_suffix(".tmp").replace(ckpt)  # atomic: a kill mid-write keeps the previous checkpoint
    summary = {
        "init_from_summary": parent,
        "name": cfg.name,
        "objective": cfg.objective,
        "params": n_params,
        "steps": cfg.steps,
        "wall_s": round(time.time() - t0, 1),
        "tokens_per_step": cfg.batch_tokens,
        "heldout_task_ce": evaluate(model, cfg, ho_tasks, make),
        "heldout_text_ce": evaluate(model, cfg, ho_corpus, make) if ho_corpus else None,
        "config": asdict(cfg),
    }
    save(model, tok, cfg, out)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _lineage(path: Path) -> dict:
    """The parent run's summary without its config (read before a same-dir save overwrites it)."""
    s = json.loads(path.read_text())
    return {k: v for k, v in s.items() if k != "config"}


def save(model, tok, cfg: TrainConfig, out: Path) -> None:
    dtype = cfg.save_dtype
    if dtype == "auto":
        mb = sum(p.numel() for p in model.parameters()) * 4 / 1e6
        dtype = "float32" if mb <= cfg.max_mb else "float16"
    model = model.to("cpu").to(getattr(torch, dtype))
    model.config.use_cache = True
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
