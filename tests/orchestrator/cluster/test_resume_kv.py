"""A resumed request goes back to the replica that holds its KV and decodes on top of it: nothing is prefilled there
again, where a replica without its KV rebuilds the prompt and the commits. Two in-process orchestrators on one
redis-server, the adopter on the first one's hosts or on hosts of its own."""

import asyncio

import pytest

from tests.orchestrator.cluster.test_takeover import LEASE_S, kill, spec, start  # noqa: F401 - start: the fixture

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("hosts", ["same", "new"])
async def test_a_resumed_request_reuses_the_kv_its_replica_holds(start, hosts):  # noqa: F811 - the fixture
    first, first_admission = await start("orch-a")
    outputs = (await first.open(spec("streaming", "moved"))).outputs()
    for _ in range(3):  # a few rounds: its KV on the drafter holds the prompt and commits
        await outputs.__anext__()
    await kill(first, first_admission)
    second, _ = await start("orch-b", first.engine.executor if hosts == "same" else None)
    drafter = second.engine.executor.host("drafter").kv
    before = drafter.prefilled
    await asyncio.sleep(LEASE_S)
    resumed = await second.resume(spec("streaming", "moved"))
    prompt = resumed.prompt_tokens
    ends = [out.finish_reason async for out in resumed.outputs()]
    assert ends[-1] in ("eos", "length")
    if hosts == "same":
        assert drafter.prefilled == before  # every round of the resumed request ran on its cached KV
    else:
        assert drafter.prefilled - before > prompt  # rebuilt: the prompt and the commits of its record
    await second.shutdown()
