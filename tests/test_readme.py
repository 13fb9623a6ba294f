"""The README's examples give what it shows. This file runs the in-process ones (the shipped zoo) and checks that every
command the README holds is run by a test or named here with the test or check that covers it; the served examples
run in tests/test_readme_served.py, on `dlm serve` and `dlm serve --local` as the README starts them."""

import re

import pytest

from services.cli.cli import build_parser
from tests.readme import README, blocks, examples, matches, run

IN_PROCESS = [e for e in examples() if e.server is None]
# commands of `bash` blocks, which no test here runs as written: where they are covered
ELSEWHERE = {
    "dlm data": "tests/training/test_bpe_corpus.py builds the data deterministically; a full build takes minutes",
    "dlm train": "tests/training/* train each model kind for a few steps; the full recipes take hours on 2 cores",
    "dlm serve --redis": "tests/orchestrator/cluster/test_services.py serves the app with its index on redis-server",
    "dlm serve --local": "tests/test_readme_served.py starts it, from its `console` example in the gRPC section",
}
# blocks that hold no command: pseudo-code, a config fragment, the layout, the CLI synopsis, output
NOT_COMMANDS = {"", "yaml", "text"}


def test_every_command_runs_or_is_covered_elsewhere():
    for block in blocks(README.read_text()):
        if block.lang == "bash":
            for line in filter(None, (ln.split("#")[0].strip() for ln in block.body.splitlines())):
                assert any(line.startswith(prefix) for prefix in ELSEWHERE), f"README.md:{block.line}: {line}"
        else:
            assert block.lang in NOT_COMMANDS | {"console", "python"}, f"README.md:{block.line}: ```{block.lang}"
    for example in examples():
        assert example.expected or example.starts_server, f"{example}: shows no output"
        known = ("dlm ", "make run", "curl ")
        assert example.kind == "python" or example.source.startswith(known), f"{example}: how is it run?"


def synopsis() -> dict[str, str]:
    """Subcommand ("" for the global options) -> the README synopsis' text for it, continuation lines joined."""
    [text] = [b.body for b in blocks(README.read_text()) if b.lang == "" and b.body.startswith("dlm [--config")]
    out = {}
    for entry in re.split(r"\n(?=dlm )", text):
        words = entry.split()
        name = words[1] if not words[1].startswith("[") else ""
        out[name] = out.get(name, "") + " " + " ".join(words)
    return out


def test_the_synopsis_lists_every_option():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    shown = synopsis()
    assert set(shown) == {"", *commands}
    for name, sub in {"": parser, **commands}.items():
        options = {o for a in sub._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        missing = {o for o in options if not re.search(rf"{o}\b", shown[name])}
        assert not missing, f"dlm {name or '(global)'}: the README's synopsis lacks {sorted(missing)}"


@pytest.mark.slow
@pytest.mark.parametrize("example", IN_PROCESS, ids=str)
def test_an_in_process_example_prints_what_the_readme_shows(example, tmp_path):
    got = run(example, tmp_path, {})
    assert matches(example.expected, got), f"{example}\nREADME shows:\n{example.expected}\nit printed:\n{got}"
