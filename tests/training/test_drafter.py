import json

import pytest
from transformers import AutoConfig

from services.training import tiny
from services.training.drafter import run


@pytest.mark.slow
@pytest.mark.parametrize("objective,family", [("hybrid", "causal"), ("mdm", "bidirectional")])
def test_drafter_trainer(tmp_path, objective, family):
    tiny.setup(tmp_path)
    cfg = tiny.config(tmp_path, f"d-{objective}", objective=objective, steps=40, token_reorder_frac=0.25, eos_pad_max=2)
    run(cfg)
    log = [json.loads(x) for x in open(tmp_path / f"runs/d-{objective}/log.jsonl")]
    first = sum(r["ce"] for r in log[:5]) / 5
    last = sum(r["ce"] for r in log[-5:]) / 5
    assert last < first - 0.5, (first, last)
    c = AutoConfig.from_pretrained(tmp_path / f"models/d-{objective}")
    raw = json.loads((tmp_path / f"models/d-{objective}/config.json").read_text())
    assert raw["mask_token_id"] == 1 and raw["dlm_family"] == family
    assert raw["is_causal"] is (family == "causal") and c.is_causal is (family == "causal")
