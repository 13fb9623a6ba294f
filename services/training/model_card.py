"""Write models/<name>/README.md from train_summary.json (+ eval json lines, if given).

python -m services.training.model_card models/guider [--eval runs/guider/eval.json ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from services.training.specials import SPECIALS

USES = {
    "ar-base": "AR base model (Qwen3 architecture), grown from the guider; initialisation of the drafters.",
    "guider": "small AR guider that verifies drafter proposals (FlashDLM-style guided diffusion).",
    "drafter-causal": "causal-attention diffusion drafter: WeDLM 4.2 dual-stream batches (prefix-conditioned "
    "blocks) and ReFusion hybrid batches (000 4.3) with WeDLM 4.1 token-level topological reordering samples. "
    "Convention: the output at a mask token predicts the token at that mask's own logical position; the output at "
    "a clean token predicts the next logical token. Always pass logical `position_ids` and an explicit "
    "`attention_mask`.",
    "drafter-bidirectional": "bidirectional (is_causal=false) masked diffusion drafter, LLaDA-style objective; "
    "the output at a mask position predicts that position's token.",
}


def _stages(s: dict) -> list[dict]:
    """Oldest first: parent runs recorded via init_from, then this one."""
    parent = s.get("init_from_summary")
    return (_stages(parent) if parent else []) + [s]


def write(model_dir: str | Path, evals: list[dict], history: list[dict] | None = None) -> Path:
    d = Path(model_dir)
    s = json.loads((d / "train_summary.json").read_text())
    if history and not s.get("init_from_summary"):
        s["init_from_summary"] = history[-1]
    c = s["config"]
    cfg = json.loads((d / "config.json").read_text())
    tok = json.loads((d / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"] if t["content"] in SPECIALS}
    meta_p = Path(c["data"]) / "meta.json"
    meta = json.loads(meta_p.read_text()) if meta_p.exists() else {}
    size_mb = (d / "model.safetensors").stat().st_size / 1e6
    arch = {
        k: cfg.get(k)
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "tie_word_embeddings",
            "is_causal",
            "mask_token_id",
            "dlm_family",
            "dtype",
        )
    }
    lines = [
        f"# {s['name']}",
        "",
        USES.get(s["name"], ""),
        "",
        "## Model",
        f"- Qwen3ForCausalLM, {s['params']:,} parameters, `model.safetensors` {size_mb:.1f} MB",
        f"- config: `{json.dumps({k: v for k, v in arch.items() if v is not None})}`",
        f"- tokenizer: byte-level BPE, vocab {cfg.get('vocab_size')}, specials {json.dumps(ids)}; "
        "chat template renders a user message as `{content}<|response|>`",
        "",
        "## Training",
        f"- objective: `{s['objective']}`; "
        + (
            f"grown (function-preserving) from: `{c['grow_from']}`"
            if c.get("grow_from")
            else f"init_from: `{c.get('init_from')}`"
        ),
        f"- data: `{c['data']}` (`dlm data --seed {meta.get('config', {}).get('seed', 0)}`): verifiable tasks "
        "(count, copy, reverse, sort, add, code) + Python stdlib source chunks "
        f"(corpus_frac {c['corpus_frac']}), python {meta.get('python', '?').split()[0]}",
        "- sequence: `prompt<|response|>response<|endoftext|>`, loss on the response (+eos) for tasks",
        f"- steps {s['steps']}, ~{c['batch_tokens']} tokens/step, lr {c['lr']} cosine (warmup {c['warmup']}), "
        f"AdamW wd {c['weight_decay']}, seed {c['seed']}, device {c['device']} ({c['dtype']})",
        f"- wall time {s['wall_s'] / 60:.1f} min on {c['threads']} CPU threads",
        "- stages (oldest first): "
        + "; ".join(
            f"{x['name']} ({x['objective']}, {x['steps']} steps, {x['wall_s'] / 60:.1f} min, "
            f"held-out task ce {x['heldout_task_ce']:.3f})"
            for x in _stages(s)
        ),
        "",
        "## Results (held-out split)",
        f"- held-out task cross-entropy (objective's labelled positions): {s['heldout_task_ce']:.4f}",
    ]
    if s.get("heldout_text_ce") is not None:
        lines.append(f"- held-out stdlib-text cross-entropy: {s['heldout_text_ce']:.4f}")
    for e in evals:
        fams = {k: v for k, v in e.items() if k not in ("model", "mode", "n", "wall_s")}
        lines += [
            "",
            f"Exact-match accuracy, `{e['mode']}` decoding, up to {e['n']} held-out items per family:",
            "",
            "| " + " | ".join(fams) + " |",
            "|" + "---|" * len(fams),
            "| " + " | ".join(f"{v:.1%}" for v in fams.values()) + " |",
        ]
    lines += [
        "",
        f"Rebuild: `dlm train {'ar' if s['objective'] == 'ar' else 'drafter'} --config configs/train/{s['name']}.yaml`",
        "",
    ]
    out = d / "README.md"
    out.write_text("\n".join(lines))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--eval", nargs="*", default=[])
    ap.add_argument("--history", nargs="*", default=[], help="train_summary.json of earlier stages, oldest first")
    a = ap.parse_args()
    evals = [json.loads(line) for p in a.eval for line in Path(p).read_text().splitlines() if line.strip()]
    hist = [json.loads(Path(p).read_text()) for p in a.history]
    for older, newer in zip(hist, hist[1:], strict=False):
        newer.setdefault("init_from_summary", older)
    print(write(a.model_dir, evals, hist))


if __name__ == "__main__":
    main()
