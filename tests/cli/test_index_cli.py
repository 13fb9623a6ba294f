"""`dlm index ls|show` against a real redis-server of its own and a running in-process orchestrator: a request that
is decoding, then the same record once its orchestrator died (lease lapsed), and the errors that name what is
wrong."""

import asyncio

import pytest

from services.cli.cli import main
from services.common.config import EngineConfig
from services.common.sampling import SamplingParams
from services.orchestrator.api.frontend import Frontend, Spec
from services.orchestrator.cluster.admission import IndexAdmission
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor
from services.serving.indexes import make_index
from services.serving.redis_process import redis_process
from tests.orchestrator.cluster.test_takeover import halt

pytestmark = pytest.mark.anyio

LEASE_S = 0.5


async def dlm(capsys, *argv: str) -> tuple[int, str, str]:
    """The CLI, on a thread of its own (it runs its own event loop) -> (exit code, stdout, stderr)."""
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_index_ls_and_show_print_what_the_index_holds(tiny_zoo, capsys):
    with redis_process() as redis:
        config = EngineConfig(models=tiny_zoo, max_new_tokens=48)
        executor = LocalExecutor(config)
        admission = IndexAdmission(make_index(redis.url), executor.placement, 60, "orch-test", LEASE_S)
        frontend = Frontend(Engine(config, executor, admission), records=admission)
        await frontend.start()
        sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=1234)
        spec = Spec("count from 1 to 9:", 48, "slot", {"slot_size": 4, "block_size": 8}, sampling, "watched")
        outputs = (await frontend.open(spec)).outputs()
        await outputs.__anext__()
        for driver in frontend.drivers:  # it stops decoding; its writer records the last round and renews its lease
            await halt(driver)
        while admission.writer.queue:
            await asyncio.sleep(0.01)
        req, record = frontend.engine.requests["watched"].req, admission.records["watched"].entry
        tokens = req.prompt_len + 48

        code, out, _ = await dlm(capsys, "index", "ls", "--redis-url", redis.url)
        assert code == 0
        header, line = out.splitlines()
        assert header.split() == ["REQUEST", "STRATEGY", "OWNER", "LEASE", "REPLICAS", "COMMITTED", "STREAMED"]
        fields = line.split()
        assert fields[:4] == ["watched", "slot", "orch-test", "alive"] and 0 < float(fields[4][:-1]) <= LEASE_S
        assert fields[5:] == ["local", str(len(req.order)), str(req.emitted)]

        code, out, _ = await dlm(capsys, "index", "show", "watched", "--redis-url", redis.url)
        assert code == 0
        shown = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith(" "))
        assert shown["strategy"] == 'slot {"block_size": 8, "slot_size": 4}'
        assert shown["owner"].startswith("orch-test (lease alive ")
        assert shown["prompt"] == f"{req.prompt_len} tokens, max_new_tokens 48, {req.stats.rounds} rounds done"
        assert shown["sampling"] == "temperature 0.8, top_p 0.9, top_k 0, seed 1234"
        assert shown["committed"].startswith(f"{len(req.order)} tokens")
        assert f"  order    {' '.join(map(str, record.order[:16]))}" in out
        assert f"  ids      {' '.join(map(str, record.token_ids[:16]))}" in out
        assert shown["streamed"] == f"{req.emitted} tokens"
        assert shown["replicas"] == "drafter local, guider local"
        assert shown["reserved"] == f"local {tokens} tokens"

        await halt(admission.writer.task)  # the orchestrator dies: its lease lapses, its record stays
        await asyncio.sleep(LEASE_S)
        code, out, _ = await dlm(capsys, "index", "ls", "--redis-url", redis.url)
        assert out.splitlines()[1].split()[:4] == ["watched", "slot", "orch-test", "lapsed"]

        code, _, err = await dlm(capsys, "index", "show", "gone", "--redis-url", redis.url)
        assert code == 2 and "request 'gone' has no record in the cache index" in err
        await halt(admission.reserver.task)
    code, _, err = await dlm(capsys, "index", "ls", "--redis-url", redis.url)  # the server is gone
    assert code == 2 and f"cache index (Redis at 127.0.0.1:{redis.port}) unavailable" in err
