"""ReFusion's slot KV reuse (000 §4.2, C.3, Table 8): the slots a verification forward accepts keep the KV that
forward computed, appended to the drafter cache in commit order; `kv=recompute` recomputes them in the next forward.

The scripted drafter's dummy K/V are the token ids, so `ScriptedLM.pasts` shows what the cache held before each
forward, physically, and `calls` what each forward ran through the model."""

import pickle

import pytest
import torch
from transformers import DynamicCache

from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.request import Request
from services.dlm_drafter.causal import CausalCache, Staged, reuse_staged
from services.orchestrator.engine.engine import Engine
from services.serving import pickling  # noqa: F401 (the compact reducers of the Serve hop)
from tests.scripted import MASK, ScriptedLM, confident, row, scripted_engine
from tests.zoo import NOT_SHIPPED, SHIPPED

PROMPT = [5, 6, 7]
TOKENS = list(range(8, 32))  # 24 plain tokens
SLOT = {"slot_size": 8, "block_size": 16, "slot_threshold": 0.9, "token_threshold": 0.4}


def slot_first_script() -> dict:
    """Slot 0's first token is below tau_slot: slot 8 is selected alone and accepted in round 1, committed ahead of
    slot 0, which the fallback selects and accepts in round 2."""
    script = confident(TOKENS[:16])
    script[0] = row({TOKENS[0]: 0.5})
    return script


def decode(script: dict, n: int, kv: str, params: dict = SLOT) -> tuple[ScriptedLM, list[int], dict]:
    model = ScriptedLM(script, len(PROMPT))
    result = scripted_engine({"drafter": model}, n).generate(PROMPT, "slot", {**params, "kv": kv})
    return model, result.token_ids, result.stats


def ids_in(model: ScriptedLM, forward: int) -> list[int]:
    return model.calls[forward][0][0].tolist()


def test_reuse_appends_the_accepted_slot_to_the_cache_instead_of_recomputing_it():
    model, ids, stats = decode(slot_first_script(), 16, "reuse")
    assert ids == TOKENS[:16] and stats["drafter_forwards"] == 4  # two rounds of draft + verify
    assert ids_in(model, 1) == TOKENS[8:16]  # round 1 verifies slot 8 alone
    # round 2's draft: slot 8 is in the cache ahead of the masks of slot 0 (commit order), not run again
    assert model.pasts[2] == PROMPT + TOKENS[8:16]
    assert ids_in(model, 2) == [MASK] * 8
    # N_fwd: 16 masks + 8 drafts, then 8 masks + 8 drafts
    assert stats["drafter_tokens_processed"] == 40 and stats["p_cache"] == 16 / 40


def test_recompute_runs_the_accepted_slot_again_in_the_next_forward():
    model, ids, stats = decode(slot_first_script(), 16, "recompute")
    assert ids == TOKENS[:16] and stats["drafter_forwards"] == 4
    assert model.pasts[2] == PROMPT
    assert ids_in(model, 2) == TOKENS[8:16] + [MASK] * 8  # pending commit, then the masks
    assert stats["drafter_tokens_processed"] == 48 and stats["p_cache"] == 16 / 48


def together_script() -> dict:
    """Four slots of 4 selected at once. Slot 0 fails at its second token in the select verification, so all four
    complete in isolation: slot 3 first, then slot 0, then slots 1 and 2, each stopping at its third token and forced
    past it. The slots complete early wait (000 §4.2), verified with the others, and all four are committed together
    from the verification forward that completed the last, in which none saw another. The last two forwards draft
    and verify the next block."""
    script = confident(TOKENS[:20])
    for position in (1, 6, 10):
        script[position] = row({TOKENS[position]: 0.3, 2: 0.25})
    return script


TOGETHER = {"slot_size": 4, "block_size": 16, "slot_threshold": 0.9, "token_threshold": 0.4}


def test_slots_completed_together_keep_the_kv_of_their_isolated_verification():
    """000 §4.2: the KV of parallel-completed slots is concatenated as computed, without inter-slot conditioning."""
    model, ids, _ = decode(together_script(), 20, "reuse", TOGETHER)
    assert ids == TOKENS[:20]
    # the forward of the next block: the four slots, in commit order, entered the cache without being run again
    block = len(model.calls) - 2
    assert model.pasts[block][-16:] == TOKENS[:16] and ids_in(model, block) == [MASK] * 4
    staging = block - 1  # the verification that completed them, slots isolated by groups
    assert ids_in(model, staging) == TOKENS[:16]
    mask = model.calls[staging][1][0].mask[:, -16:] == 0  # what the request's 16 queries see of its new tokens
    slot = torch.arange(16) // 4
    assert not (mask & (slot[:, None] != slot[None, :])).any()  # no slot saw another


def test_recompute_runs_slots_completed_together_again():
    model, ids, _ = decode(together_script(), 20, "recompute", TOGETHER)
    assert ids == TOKENS[:20]
    assert ids_in(model, len(model.calls) - 2) == TOKENS[:16] + [MASK] * 4


# ---------------------------------------------------------------- which staged entries a commit may take


def cache_of(ids: list[int]) -> DynamicCache:
    cache = DynamicCache()
    if ids:
        dummy = torch.tensor(ids, dtype=torch.float)[None, None, :, None]
        cache.update(dummy, dummy, 0)
    return cache


def cached_ids(cache: DynamicCache) -> list[int]:
    return cache.layers[0].keys[0, 0, :, 0].long().tolist()


def staged_request(committed: list[int], ids: list[int]) -> Request:
    req = Request("r", PROMPT, 16, MASK, 0)
    req.decide(torch.tensor(committed), torch.tensor(ids))
    req.commit(committed)
    req.stats.rounds = 3
    return req


def staged_cache(order: int = 0, round_: int = 2) -> CausalCache:
    """Prompt cached; slots 4..7 and 0..3 staged by a forward of round 2 (of the request's rounds so far)."""
    ids = [40, 41, 42, 43, 30, 31, 32, 33]
    return CausalCache(cache_of(PROMPT), staged=Staged(cache_of(ids), [4, 5, 6, 7, 0, 1, 2, 3], ids, order, round_))


def test_commits_take_their_staged_kv_in_commit_order():
    req = staged_request([0, 1, 2, 3, 4, 5, 6, 7], [30, 31, 32, 33, 40, 41, 42, 43])
    cache = staged_cache()
    reuse_staged(cache, req)
    assert cached_ids(cache.kv) == PROMPT + [30, 31, 32, 33, 40, 41, 42, 43] and cache.committed == 8
    assert cache.staged is None


def test_a_token_changed_after_staging_is_recomputed_with_every_later_commit():
    """The gate may replace a draft after the forward (slot completion without progress): that entry was computed
    from another token."""
    req = staged_request([4, 5, 6, 7, 0, 1, 2, 3], [40, 41, 99, 43, 30, 31, 32, 33])
    cache = staged_cache()
    reuse_staged(cache, req)
    assert cached_ids(cache.kv) == PROMPT + [40, 41] and cache.committed == 2


@pytest.mark.parametrize("order,round_", [(1, 2), (0, 1)], ids=["cache moved on", "an older round"])
def test_stale_staged_kv_is_dropped(order, round_):
    req = staged_request([4, 5, 6, 7], [40, 41, 42, 43])
    cache = staged_cache(order, round_)
    reuse_staged(cache, req)
    assert cached_ids(cache.kv) == PROMPT and cache.committed == 0 and cache.staged is None


# ---------------------------------------------------------------- the served path: the KV lives on the replica


def over_the_hop(engine: Engine, lose_kv_after: int | None = None):
    """Every host call as on a Serve replica: the host gets pickled copies of the request, the engine pickled
    replies. lose_kv_after: after that many drafter calls, the replica drops every request's KV (a restarted
    replica), and the next call rebuilds it from req.order."""
    execute, calls = engine.executor.execute, []

    async def hop(groups, parents=None):
        if lose_kv_after is not None and len(calls) == lose_kv_after:
            host = engine.executor.host("drafter")
            host.release(list(host.held()))
        calls.extend(key for key in groups if key[0] == "drafter")
        sent = pickle.loads(pickle.dumps(groups))
        return {key: pickle.loads(pickle.dumps(replies)) for key, replies in (await execute(sent, parents)).items()}

    engine.executor.execute = hop


def test_reuse_happens_on_the_replica_across_the_hop():
    alone_model, alone_ids, alone = decode(slot_first_script(), 16, "reuse")
    model = ScriptedLM(slot_first_script(), len(PROMPT))
    engine = scripted_engine({"drafter": model}, 16)
    over_the_hop(engine)
    result = engine.generate(PROMPT, "slot", {**SLOT, "kv": "reuse"})
    assert result.token_ids == alone_ids
    assert result.stats["drafter_tokens_processed"] == alone["drafter_tokens_processed"] == 40
    assert model.pasts == alone_model.pasts


def test_a_replica_that_lost_the_kv_rebuilds_it_from_the_commit_order():
    model = ScriptedLM(slot_first_script(), len(PROMPT))
    engine = scripted_engine({"drafter": model}, 16)
    over_the_hop(engine, lose_kv_after=2)  # after round 1's verification staged slot 8
    result = engine.generate(PROMPT, "slot", {**SLOT, "kv": "reuse"})
    assert result.token_ids == TOKENS[:16]
    # round 2's draft on a fresh cache: the prompt and slot 8 prefilled in commit order, then slot 0's masks
    assert model.pasts[2] == [] and ids_in(model, 2) == PROMPT + TOKENS[8:16] + [MASK] * 8


# ---------------------------------------------------------------- the shipped zoo

# main's slot decode before KV reuse (commit e6b4908), 48 new tokens: (token ids, drafter forwards, N_fwd)
RECORDED = {
    "count from 30 step 3 for 21:": (
        [21, 18, 343, 21, 343, 24, 343, 27, 340, 20, 340, 23, 340, 26, 341, 19, 341, 22, 341, 25, 355, 18, 355, 21]
        + [355, 24, 355, 27, 372, 20, 372, 23, 372, 26, 384, 19, 384, 22, 384, 25, 395, 18],
        17,
        560,
    ),
    "sort: 58 68 49 27 13 91 67": ([19, 21, 348, 25, 340, 27, 341, 26, 355, 25, 355, 26, 395, 19], 5, 176),
}


@pytest.fixture(scope="module")
def zoo_engine() -> Engine:
    config = EngineConfig.from_yaml(DEFAULT_CONFIG, max_new_tokens=48)
    if not SHIPPED:
        pytest.skip(NOT_SHIPPED)
    return Engine(config)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", sorted(RECORDED))
def test_recompute_is_mains_slot_decode_and_reuse_processes_fewer_tokens(zoo_engine, prompt):
    ids, forwards, processed = RECORDED[prompt]
    recompute = zoo_engine.generate(prompt, "slot", {"kv": "recompute"})
    assert (recompute.token_ids, recompute.stats["drafter_forwards"]) == (ids, forwards)
    assert recompute.stats["drafter_tokens_processed"] == processed
    reuse = zoo_engine.generate(prompt, "slot")
    assert reuse.stats["drafter_forwards"] < reuse.stats["tokens"]
    assert reuse.stats["drafter_tokens_processed"] <= processed
