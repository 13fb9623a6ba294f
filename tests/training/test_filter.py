"""The filter trainer: EGP trajectories run past the reference's EOS to its block's end (scripted drafters), and on
the tiny bidirectional drafter they are well formed and BCE falls."""

import pytest
import torch

from services.filter.model import Learn2PDFilter
from services.training.filter import FilterTrainConfig, egp, fit, record
from tests.scripted import EOS, ScriptedLM, confident, row, scripted_engine

PROMPT = [5, 6, 7]


@pytest.mark.parametrize("drafter", ["causal", "bidirectional"])
def test_egp_labels_run_past_the_reference_eos_to_the_block_end(drafter):
    # the drafter answers 10 11 12 EOS, then EOS to the block's end, except position 5, where it says 9
    script = confident([10, 11, 12, EOS, EOS, EOS, EOS, EOS])
    script[5] = row({9: 0.9, EOS: 0.05})
    role = "drafter" if drafter == "causal" else "drafter_bidirectional"
    engine = scripted_engine({role: ScriptedLM(script, len(PROMPT), drafter == "bidirectional")}, 16)
    mdm = {"drafter": drafter, "block_size": 8, "steps_per_block": 8}
    cfg = FilterTrainConfig(drafter, reference="mdm", reference_params=mdm, max_new_tokens=16, block_size=8)
    rows = egp(engine, [PROMPT], cfg)
    confidence, label, active = (torch.stack(col) for col in zip(*rows, strict=True))
    # step 1: every position of the block is masked, and all but position 5 already right (EOS past the EOS too);
    # step 2: position 5 is still wrong, and takes its reference token. The second block is never entered.
    assert active.tolist() == [[1] * 8, [0, 0, 0, 0, 0, 1, 0, 0]]
    assert label.tolist() == [[1, 1, 1, 1, 1, 0, 1, 1], [0] * 8]
    assert confidence[0, 5].item() == pytest.approx(0.9)


def test_egp_trajectories_and_fit(engine, tmp_path):
    cfg = FilterTrainConfig(out=str(tmp_path / "filter"), max_new_tokens=12, block_size=8, epochs=60)
    rows = egp(engine, ["count from 1 to 9:"], cfg)
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
