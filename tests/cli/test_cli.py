import json

import yaml

from services.cli.cli import main


def write_config(tmp_path, tiny_zoo) -> str:
    path = tmp_path / "dlm.yaml"
    path.write_text(yaml.safe_dump({"engine": {"models": tiny_zoo, "max_new_tokens": 12}}))
    return str(path)


def test_generate_json_contract(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    code = main(["--config", config, "generate", "--strategy", "ar", "--set", "model=guider", "--json", "count:"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"text", "token_ids", "finish_reason", "stats"}
    assert {"rounds", "drafter_forwards", "guider_forwards", "tokens", "tpf", "p_cache", "ttft_s", "wall_s"} <= set(
        out["stats"]
    )
    assert out["stats"]["guider_forwards"] == out["stats"]["rounds"] == len(out["token_ids"])


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
    assert [r["strategy"] for r in rows] == ["ar", "mdm", "streaming"]
    assert rows[0]["speedup_vs_ar"] == 1.0 and rows[1]["speedup_vs_mdm"] == 1.0
    assert "p_cache" in capsys.readouterr().out


def test_eval_json_contract(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    args = ["--config", config, "eval", "--strategy", "ar", "--model", "guider", "--n", "1", "--json"]
    assert main([*args, "--families", "sort"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"accuracy", "overall_accuracy", "nll", "stats"} and set(out["accuracy"]) == {"sort"}
