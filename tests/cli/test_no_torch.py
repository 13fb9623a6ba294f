"""`dlm --help` and `dlm generate --target` start without torch: they run here with `import torch` made to fail."""

import os
import subprocess
import sys

import pytest

from services.common.params import STRATEGY_NAMES
from services.common.sampling import SamplingParams
from services.orchestrator.decode.strategies import STRATEGIES
from services.serving.wire import strategy_names
from tests.orchestrator.api.test_server import Harness, backend

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "count from 1 to 9:"


def dlm(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter where `import torch` raises."""
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('torch imported by a command that must not need it')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), ROOT])}
    command = [sys.executable, "-m", "services.cli.cli", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_the_fake_torch_fails_to_import(tmp_path):
    done = dlm(tmp_path, "generate", "--strategy", "ar", PROMPT)  # in process: needs torch
    assert done.returncode != 0 and "torch imported by a command" in done.stderr


@pytest.mark.parametrize(
    "args", [["--help"], ["generate", "--help"], ["bench", "--help"], ["serve", "--help"], ["index", "ls", "--help"]]
)
def test_help_needs_no_torch(tmp_path, args):
    done = dlm(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert "usage: dlm" in done.stdout


@pytest.fixture(scope="module")
def server(engine):
    harness = Harness(backend(engine))
    harness.client.wait_ready()
    yield harness
    harness.close()


def test_generate_on_a_target_needs_no_torch(tmp_path, server, engine):
    params = {"window": 6}
    expected = engine.generate(PROMPT, "pipeline", params, 8, SamplingParams(seed=0))
    target = f"127.0.0.1:{server.port}"
    args = ["generate", "--target", target, "--strategy", "pipeline", "--set", "window=6", "--max-new-tokens", "8"]
    done = dlm(tmp_path, *args, "--seed", "0", "--logprobs", "1", "--stats", PROMPT)
    assert done.returncode == 0, done.stderr
    text, heading, *rows = done.stdout.splitlines()
    assert text == expected.text and heading.startswith("logprobs (sum ")
    tokens = [engine.tokenizer.decode([t]) for t in expected.token_ids]
    assert all(row.strip().startswith(repr(t)) for row, t in zip(rows[: len(tokens)], tokens, strict=True))
    assert done.stderr.strip().endswith("tok/s")


def test_the_clis_strategy_names_are_the_engines_and_the_wires():
    assert STRATEGY_NAMES == tuple(STRATEGIES)
    assert set(STRATEGY_NAMES) == set(strategy_names())


def test_index_ls_needs_no_torch(tmp_path, redis_url):
    done = dlm(tmp_path, "index", "ls", "--redis-url", redis_url)
    assert done.returncode == 0, done.stderr
    assert "torch" not in done.stderr
