"""`dlm generate --trace-png/--trace-json` and `dlm bench --plot` write valid PNGs; the trace data lists one entry per
committed token with the round that decided it."""

import json

import pytest

from services.cli.cli import main
from tests.cli.test_cli import write_config

pytest.importorskip("matplotlib")
PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_generate_trace_png_and_its_data(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    png, data = tmp_path / "trace.png", tmp_path / "trace.json"
    argv = ["--config", config, "generate", "--strategy", "pipeline", "--set", "window=6", "--json"]
    assert main([*argv, "--trace-png", str(png), "--trace-json", str(data), "count from 1 to 9:"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert min(png_size(png)) >= 400
    trace = json.loads(data.read_text())
    assert [t["token_id"] for t in trace["tokens"]] == out["token_ids"]
    assert [t["position"] for t in trace["tokens"]] == list(range(len(out["token_ids"])))
    assert len(trace["rounds"]) == out["stats"]["rounds"]
    for t in trace["tokens"]:  # decided in the round it names, and never before
        assert t["position"] in trace["rounds"][t["round"] - 1]["decided"]
    frontiers = [r["frontier"] for r in trace["rounds"]]
    assert frontiers == sorted(frontiers) and frontiers[-1] >= len(out["token_ids"])


def test_bench_plot_for_strategies_and_for_concurrency(tmp_path, tiny_zoo, capsys):
    config = write_config(tmp_path, tiny_zoo)
    strategies, levels = tmp_path / "strategies.png", tmp_path / "levels.png"
    base = ["--config", config, "bench", "--max-new-tokens", "6"]
    assert main([*base, "--strategies", "streaming", "--plot", str(strategies)]) == 0
    assert main([*base, "--concurrency", "1,2", "--strategy", "streaming", "--plot", str(levels)]) == 0
    assert min(png_size(strategies)) >= 400 and min(png_size(levels)) >= 400
