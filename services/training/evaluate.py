"""Held-out task accuracy of one model directory for its model card, decoded by the engine itself:
`ar` (greedy AR with KV cache) for AR models and causal drafters, `mdm` (LLaDA low-confidence remasking, one
token per forward) for drafters. The numbers `dlm eval` reports, in the one-line form model_card.py reads.

    python -m services.training.evaluate models/guider [--mode ar|mdm] [--n 200]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from services.common.config import EngineConfig
from services.common.models import load_meta
from services.training import tasks


def evaluate(model_dir: str, n: int = 200, mode: str = "ar") -> dict:
    from services.orchestrator.engine.engine import Engine
    from services.training.engine_eval import evaluate as engine_eval

    if mode == "ar":
        models, strategy, params = {"ar": model_dir}, "ar", {"model": "ar"}
    else:
        family = "bidirectional" if load_meta(model_dir).bidirectional else "causal"
        role = "drafter_bidirectional" if family == "bidirectional" else "drafter"
        models, strategy, params = {role: model_dir}, "mdm", {"drafter": family}
    start = time.time()
    report = engine_eval(Engine(EngineConfig(models=models)), strategy, params, "tasks", n, nll=False)
    return {**{f: round(report["accuracy"][f], 4) for f in tasks.FAMILIES}, "wall_s": round(time.time() - start, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--mode", choices=("ar", "mdm"), default="ar")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--data", default="data", help="unused: held-out items come from the task generator")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps({"model": a.model_dir, "mode": a.mode, "n": a.n, **evaluate(a.model_dir, a.n, a.mode)}))


if __name__ == "__main__":
    main()
