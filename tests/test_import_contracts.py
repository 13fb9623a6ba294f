"""`lint-imports` (make lint) keeps the layers of pyproject.toml: a tree with one forbidden import fails it."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=tree, capture_output=True, text=True, env={"PYTHONPATH": str(tree)}
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "services", tmp_path / "services", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def inject(tree: Path, module: str, line: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(line + "\n" + path.read_text())


def test_the_tree_as_it_is_keeps_every_contract(tree):
    result = lint(tree)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    "module, line, broken",
    [
        ("services.orchestrator.decode.gate", "import ray", "without Ray, gRPC, Redis or FastAPI"),
        ("services.orchestrator.engine.scheduler", "import grpc", "without Ray, gRPC, Redis or FastAPI"),
        ("services.orchestrator.engine.engine", "import fastapi", "without Ray, gRPC, Redis or FastAPI"),
        ("services.orchestrator.decode.commit", "import services.orchestrator.engine.engine", "Layers"),
        ("services.orchestrator.api.frontend", "import services.orchestrator.cluster.app", "Layers"),
        ("services.common.proposal", "import redis", "runtime shared by every service"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tree, module, line, broken):
    inject(tree, module, line)
    result = lint(tree)
    assert result.returncode != 0
    summary = " ".join(result.stdout.split())  # lint-imports wraps long contract names
    assert re.search(re.escape(broken) + r"(?:(?!KEPT).)*? BROKEN", summary), result.stdout
