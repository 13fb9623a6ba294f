"""The filter trainer on the tiny bidirectional drafter: EGP trajectories are well formed and BCE falls."""

import torch

from services.filter.model import Learn2PDFilter
from services.training.filter import FilterTrainConfig, egp, fit, record


def test_egp_trajectories_and_fit(engine, tmp_path):
    cfg = FilterTrainConfig(out=str(tmp_path / "filter"), max_new_tokens=12, block_size=8, epochs=60)
    rows = egp(engine, "count from 1 to 9:", cfg)
    assert rows
    for confidence, label, active in rows:
        assert ((confidence > 0) & (confidence <= 1)).all()
        assert (label <= active).all()  # labels only where a position was masked
    data = record(engine, ["count from 1 to 9:", "copy: the lazy dog"], cfg)
    model, report = fit(data, cfg)
    assert report["train"]["bce"] < report["initial_train_bce"]
    assert set(report["val"]) == {"bce", "precision", "recall"}
    model.save(cfg.out)
    reloaded = Learn2PDFilter.load(cfg.out)
    torch.testing.assert_close(reloaded(data.confidence), model(data.confidence))
