import pytest

from services.common.config import EngineConfig
from services.orchestrator.engine import Engine
from tests.tiny import zoo


@pytest.fixture(scope="session")
def tiny_zoo(tmp_path_factory) -> dict[str, str]:
    return zoo(str(tmp_path_factory.mktemp("zoo")))


@pytest.fixture(scope="session")
def engine(tiny_zoo) -> Engine:
    return Engine(EngineConfig(models=tiny_zoo, max_new_tokens=24))
