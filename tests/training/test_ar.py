import json

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from services.training import tiny
from services.training.ar import make_ar_batch, run
from services.training.dataset import Example


def test_ar_batch_labels():
    b = make_ar_batch([Example([5, 6, 7, 2, 8, 9, 0], 4, "x"), Example([3, 4, 5], 0, "text")])
    assert b.labels[0].tolist() == [-100, -100, -100, 8, 9, 0, -100]  # output at <|response|> predicts 8
    assert b.labels[1].tolist() == [4, 5, -100, -100, -100, -100, -100]
    assert b.attention_mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0]
    assert torch.isclose(b.weights.sum(), torch.tensor(1.0))


@pytest.mark.slow
def test_ar_trainer_loss_falls_and_saves(tmp_path):
    tiny.setup(tmp_path)
    cfg = tiny.config(tmp_path, "ar-tiny", steps=40)
    s = run(cfg)
    log = [json.loads(x) for x in open(tmp_path / "runs/ar-tiny/log.jsonl")]
    first = sum(r["ce"] for r in log[:5]) / 5
    last = sum(r["ce"] for r in log[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert s["heldout_task_ce"] < first
    out = tmp_path / "models/ar-tiny"
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    Qwen3ForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out, local_files_only=True)
    # resume from the last checkpoint is a no-op that still saves
    s2 = run(tiny.config(tmp_path, "ar-tiny", steps=40), resume=True)
    assert abs(s2["heldout_task_ce"] - s["heldout_task_ce"]) < 1e-4
