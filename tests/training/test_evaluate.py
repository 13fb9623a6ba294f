import json

import pytest

from services.training import evaluate, model_card, tiny
from services.training.drafter import run


@pytest.mark.slow
def test_evaluate_and_card(tmp_path):
    tiny.setup(tmp_path)
    cfg = tiny.config(tmp_path, "d", objective="hybrid", steps=3)
    run(cfg)
    d = tmp_path / "models/d"
    for mode in ("ar", "mdm"):
        r = evaluate.evaluate(str(d), n=2, mode=mode)
        assert set(r) >= {"count", "copy", "reverse", "sort", "add", "code"}
        assert all(0 <= r[f] <= 1 for f in ("count", "add"))
    card = model_card.write(d, [{"model": "d", "mode": "ar", "n": 2, "count": 0.5, "add": 0.0, "wall_s": 1}])
    text = card.read_text()
    assert "held-out task cross-entropy" in text and "50.0%" in text
    assert json.loads((d / "config.json").read_text())["dlm_family"] == "causal"
