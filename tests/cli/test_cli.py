import json
import re

import pytest
import yaml
from transformers import AutoTokenizer

from services.cli.cli import main
from services.common.params import STATS_KEYS, stats_line

GUIDER = ["generate", "--strategy", "ar", "--set", "model=guider", "--json"]


def write_config(tmp_path, tiny_zoo) -> str:
    path = tmp_path / "dlm.yaml"
    path.write_text(yaml.safe_dump({"engine": {"models": tiny_zoo, "max_new_tokens": 12}}))
    return str(path)


def test_generate_json_contract(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    code = main(["--config", config, "generate", "--strategy", "ar", "--set", "model=guider", "--json", "count:"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"text", "token_ids", "finish_reason", "seed", "stats"}
    assert set(out["stats"]) == set(STATS_KEYS)
    stats = out["stats"]
    assert stats["guider_forwards"] == stats["model_forwards"] == stats["rounds"] == len(out["token_ids"])
    assert stats["tokens_per_forward"] == 1.0


def generate(capsys, config: str, *args: str) -> dict:
    assert main(["--config", config, *GUIDER, *args, "count:"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_stop_cuts_the_text_like_the_server(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    full = generate(capsys, config)
    stop = full["text"][1:3]
    out = generate(capsys, config, "--stop", "unseen", "--stop", stop)
    assert out["text"] == full["text"][: full["text"].index(stop)] and out["finish_reason"] == "stop_sequence"
    tok = AutoTokenizer.from_pretrained(tiny_zoo["guider"])
    ids = out["token_ids"]
    assert ids == full["token_ids"][: len(ids)]  # ending with the token that completed the stop string
    assert stop in tok.decode(ids) and stop not in tok.decode(ids[:-1])


def test_an_unset_seed_is_fresh_and_the_printed_one_reproduces_the_text(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    first, second = (generate(capsys, config, "--temperature", "1.0") for _ in range(2))
    assert first["seed"] != second["seed"] and first["token_ids"] != second["token_ids"]
    again = generate(capsys, config, "--temperature", "1.0", "--seed", str(first["seed"]))
    assert (again["token_ids"], again["seed"]) == (first["token_ids"], first["seed"])


def test_loading_is_quiet_unless_verbose_and_stats_is_one_line(tmp_path, tiny_zoo, capfd):
    config = write_config(tmp_path, tiny_zoo)
    assert main(["--config", config, "generate", "--strategy", "ar", "--stats", "count:"]) == 0
    out, err = capfd.readouterr()
    assert "Loading weights" not in err and out.strip()
    assert re.fullmatch(r"12 tokens, 12 rounds, TPF 1\.00, [\d.]+ tok/s\n", err)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    hf_logging.enable_progress_bar()
    assert main(["--config", config, "--verbose", "generate", "--strategy", "ar", "count:"]) == 0
    assert "Loading weights" in capfd.readouterr().err


def test_the_stats_line_counts_in_the_singular_too():
    stats = {"tokens": 1, "rounds": 1, "tpf": 1.0, "wall_s": 0.5}
    assert stats_line(stats) == "1 token, 1 round, TPF 1.00, 2.0 tok/s"


def test_logprobs_print_token_texts(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    assert main(["--config", config, *GUIDER, "--logprobs", "2", "count:"]) == 0
    out = json.loads(capsys.readouterr().out)
    tok = AutoTokenizer.from_pretrained(tiny_zoo["guider"])
    assert [e["token"] for e in out["logprobs"]] == [tok.decode([t]) for t in out["token_ids"]]
    assert all(e["top_tokens"] == [tok.decode([t]) for t, _ in e["top"]] for e in out["logprobs"])
    assert main(["--config", config, *GUIDER[:-1], "--logprobs", "2", "count:"]) == 0
    text, heading, *rows = capsys.readouterr().out.splitlines()
    assert heading.startswith("logprobs") and rows[0].split()[0] == repr(out["logprobs"][0]["token"]).split()[0]


def test_generate_bad_parameter_exits_2(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    assert main(["--config", config, "generate", "--strategy", "streaming", "--set", "window=0", "x"]) == 2
    assert "window" in capsys.readouterr().err


def test_bench_table_and_json(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    out_file = tmp_path / "bench.json"
    assert (
        main(
            ["--config", config, "bench", "--strategies", "streaming", "--max-new-tokens", "8", "--json", str(out_file)]
        )
        == 0
    )
    rows = json.loads(out_file.read_text())
    assert [r["strategy"] for r in rows] == ["ar", "ar-drafter", "ar-guider", "mdm", "streaming"]
    speedups = ["speedup_vs_ar", "speedup_vs_ar_drafter", "speedup_vs_ar_guider", "speedup_vs_mdm"]
    assert [row[key] for row, key in zip(rows, speedups, strict=False)] == [1.0] * 4
    assert all(row["model_forwards"] == row["rounds"] for row in rows[1:3])  # one forward per token alone
    streaming = rows[4]
    assert streaming["tokens_per_forward"] == streaming["tokens"] / streaming["model_forwards"]
    out = capsys.readouterr().out
    assert "TPF" in out and "tok/fwd" in out and "vs drafter" in out and "vs guider" in out


def test_eval_json_contract(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    args = ["--config", config, "eval", "--strategy", "ar", "--model", "guider", "--n", "1", "--json"]
    assert main([*args, "--families", "sort"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"accuracy", "overall_accuracy", "nll", "stats"} and set(out["accuracy"]) == {"sort"}


@pytest.mark.parametrize(
    "sets,expected",
    [
        ([], ["mdm", "threshold", "ar-base"]),  # guided drafts with the bidirectional drafter by default
        (["drafter=causal"], ["ar-drafter", "mask-drafter", "ar-base"]),
        (["follow=guider"], ["ar-guider"]),
    ],
)
def test_eval_weighs_a_strategy_against_the_decodes_it_follows(tmp_path, tiny_zoo, capsys, sets, expected):
    """follow=drafter (the default): the drafter's own decoding and ar-base (the same-size AR model); follow=guider:
    the guider alone."""
    config = write_config(tmp_path, tiny_zoo)
    args = ["--config", config, "eval", "--strategy", "guided", "--n", "1", "--families", "sort", "--baselines"]
    assert main([*args, *[x for s in sets for x in ("--set", s)], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["baselines"]) == expected
    assert all(set(b) >= {"overall_accuracy", "stats"} for b in out["baselines"].values())
