"""The gRPC server over loopback, in-process: a real grpc.aio server on an ephemeral port, the sync client."""

import argparse
import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace

import grpc
import pytest
import yaml

from services.cli.cli import main
from services.cli.client import DlmClient
from services.cli.remote_cli import bench_remote, generate_remote
from services.common.sampling import SamplingParams
from services.orchestrator.api import grpc_server
from services.orchestrator.api.frontend import Frontend
from services.orchestrator.api.grpc_server import Limits, Server
from services.orchestrator.decode.round import one_round
from services.orchestrator.decode.strategies import STRATEGIES, defaults
from services.orchestrator.engine import engine as engine_module
from services.orchestrator.engine.engine import Engine
from services.serving.wire import SERVICE, pb
from tests.cli.test_cli import write_config

PROMPT = "count from 1 to 9:"
SMALL = {
    "guided": {"block_size": 8},
    "slot": {"slot_size": 4, "block_size": 8},
    "streaming": {"window": 6},
    "pipeline": {"window": 6},
}
SAMPLING = dict(temperature=0.7, top_p=0.9, seed=11)


class Harness:
    """A Server on its own event-loop thread, and a client (client: DlmClient's api_key and tls_* arguments)."""

    def __init__(self, backend, limits: Limits | None = None, **client):
        self.backend = backend
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = Server(backend, limits)
        self.port = self.call(self.server.start())
        self.client = DlmClient(f"127.0.0.1:{self.port}", timeout=30, **client)

    def call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.client.close()
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def backend(engine) -> Frontend:
    """A server's own engine over the library engine's models (its KV hosts are shared)."""
    return Frontend(Engine(engine.config, executor=engine.executor))


@pytest.fixture(scope="module")
def served(engine):
    serving = replace(engine.config.serving, limits=Limits(max_new_tokens=64))
    harness = Harness(Frontend(Engine(replace(engine.config, serving=serving), executor=engine.executor)))
    assert harness.server.limits.max_new_tokens == 64  # the server's limits are the config's serving.limits
    harness.client.wait_ready()
    yield harness
    harness.close()


@pytest.fixture
def slow(monkeypatch):
    """Decode with a pause per round."""

    def slow_round(req, stages):
        committed = yield from one_round(req, stages)
        time.sleep(0.05)
        return committed

    monkeypatch.setattr(engine_module, "one_round", slow_round)


def holds_state(backend, request_id: str) -> bool:
    """Whether a host still keeps KV for the request."""
    return any(request_id in host.kv.caches for host in backend.engine.executor.hosts.values() if hasattr(host, "kv"))


def gone(backend, request_id: str, within: float = 1.0) -> bool:
    end = time.monotonic() + within
    while backend.live() or holds_state(backend, request_id):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def collect(events) -> tuple[str, list[int], list, object]:
    text, ids, spans, done = "", [], [], None
    for event in events:
        if isinstance(event, pb.Chunk):
            text += event.text
            ids += event.token_ids
        elif isinstance(event, pb.Spans):
            spans += event.spans
        else:
            done = event
    return text, ids, spans, done


@pytest.mark.parametrize("sampling", [{}, SAMPLING], ids=["greedy", "sampled"])
@pytest.mark.parametrize("strategy", sorted(SMALL))
def test_stream_equals_unary_equals_engine(served, engine, strategy, sampling):
    params = SMALL[strategy]
    expected = engine.generate(PROMPT, strategy, params, 16, SamplingParams(**sampling))
    kwargs = dict(strategy=strategy, params=params, max_new_tokens=16, **sampling)
    unary = served.client.generate(PROMPT, **kwargs)
    text, ids, spans, done = collect(served.client.stream(PROMPT, **kwargs))
    assert text == unary.text == expected.text
    assert ids == list(unary.token_ids) == expected.token_ids
    reason = pb.FinishReason.Value(f"FINISH_REASON_{expected.finish_reason.upper()}")
    assert done.finish_reason == unary.finish_reason == reason
    assert done.stats.rounds == unary.stats.rounds == expected.stats["rounds"]
    assert done.usage.completion_tokens == len(ids) and done.usage.prompt_tokens > 0
    if strategy == "slot" and not sampling:
        assert spans, "greedy slot decoding of PROMPT commits slots ahead of the prefix"
    for span in spans:  # a slot committed ahead of the prefix holds the tokens the prefix later reaches
        reached = expected.token_ids[span.offset : span.offset + len(span.token_ids)]
        assert reached == list(span.token_ids)[: len(reached)]


@pytest.mark.parametrize("held", [False, True], ids=["plain", "text held to the end"])
def test_the_last_chunk_comes_inside_the_complete_where_the_request_asks(served, engine, held):
    """last_chunk_in_complete: the same chunks, the last one inside the Complete, one message fewer. With a stop
    sequence that the text's last character could begin, that character is held back to the end and still comes
    in the last chunk. DlmClient, which asks for it, yields the chunk before the Complete."""
    text = engine.generate(PROMPT, "streaming", {"window": 6}, 16).text
    stop = [text[-1] + "\x00\x00"] if held else []
    kwargs = dict(strategy="streaming", params={"window": 6}, max_new_tokens=16, stop=stop)
    plain, asked = (DlmClient.request(PROMPT, **kwargs) for _ in range(2))
    asked.last_chunk_in_complete = True
    messages = {}
    for name, req in (("plain", plain), ("asked", asked)):
        messages[name] = list(served.client.stub.GenerateStream(req, timeout=30))
    assert [m.WhichOneof("event") for m in messages["asked"]] == ["chunk"] * (len(messages["plain"]) - 2) + ["complete"]
    chunks = [m.chunk for m in messages["asked"][:-1]] + [messages["asked"][-1].complete.last_chunk]
    assert chunks == [m.chunk for m in messages["plain"][:-1]]
    assert not messages["plain"][-1].complete.HasField("last_chunk")
    assert "".join(c.text for c in chunks) == text
    if held:
        assert chunks[-1].text.endswith(text[-1])
    events = list(served.client.stream(PROMPT, **kwargs))
    assert events[:-1] == chunks and isinstance(events[-1], pb.Complete)
    assert not events[-1].HasField("last_chunk")


def test_trace_has_a_row_per_round(served):
    unary = served.client.generate(PROMPT, strategy="streaming", params={"window": 6}, max_new_tokens=8, trace=True)
    assert len(unary.trace) == unary.stats.rounds
    assert sum(r.prefix_tokens for r in unary.trace) >= len(unary.token_ids)


def request(**kw):
    base = dict(text=PROMPT, max_new_tokens=4)
    return pb.GenerateRequest(**{**base, **kw})


def prompt_ids(*token_ids: int):
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=token_ids), max_new_tokens=4)


def params(**kw):
    return request(params=pb.StrategyParams(**kw))


BAD = [
    ("no input", pb.GenerateRequest(max_new_tokens=4), "prompt"),
    ("empty text", request(text=""), "prompt"),
    ("empty token ids", prompt_ids(), "prompt"),
    ("prompt over context", request(text="word " * 600), "prompt"),
    ("ids outside vocab", prompt_ids(5, 10**6), "token ids"),
    ("max_new_tokens 0", request(max_new_tokens=0), "max_new_tokens"),
    ("max_new_tokens < 0", request(max_new_tokens=-3), "max_new_tokens"),
    ("max_new_tokens over limit", request(max_new_tokens=65), "max_new_tokens"),
    ("unknown strategy", request(strategy="nope"), "strategy"),
    ("window 0", params(streaming=pb.StreamingParams(window=0)), "window"),
    ("token_threshold > 1", params(slot=pb.SlotParams(token_threshold=1.5)), "token_threshold"),
    ("slot must divide block", params(slot=pb.SlotParams(slot_size=3, block_size=8)), "slot_size"),
    ("guidance > 1", params(pipeline=pb.PipelineParams(guidance_threshold=2)), "guidance_threshold"),
    ("cache mode", params(threshold=pb.ThresholdParams(cache="huge")), "cache"),
    ("params of another strategy", request(strategy="slot", params=pb.StrategyParams(streaming={})), "params"),
    ("too many stops", request(stop=[str(i) for i in range(9)]), "stop"),
    ("stop too long", request(stop=["x" * 65]), "stop"),
    ("empty stop", request(stop=[""]), "stop"),
    ("temperature < 0", request(sampling=pb.SamplingParams(temperature=-1)), "temperature"),
    ("temperature nan", request(sampling=pb.SamplingParams(temperature=float("nan"))), "temperature"),
    ("top_p 0", request(sampling=pb.SamplingParams(top_p=0)), "top_p"),
    ("request_id too long", request(request_id="r" * 200), "request_id"),
    ("request_id naming another's key", request(request_id="x:ids"), "request_id"),
    ("request_id with a space", request(request_id="a b"), "request_id"),
]


@pytest.mark.parametrize("bad,field", [(b, f) for _, b, f in BAD], ids=[name for name, _, _ in BAD])
def test_bad_request_is_invalid_argument_and_server_goes_on(served, bad, field):
    for call in (served.client.stub.Generate, lambda r, **kw: list(served.client.stub.GenerateStream(r, **kw))):
        with pytest.raises(grpc.RpcError) as err:
            call(bad, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in err.value.details()
    assert served.client.generate(PROMPT, strategy="streaming", max_new_tokens=2).usage.completion_tokens > 0
    assert served.backend.live() == []


class GatedBackend(Frontend):
    def __init__(self, engine, gate: threading.Event):
        super().__init__(Engine(engine.config, executor=engine.executor))
        self.gate = gate

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.gate.wait, 30)
        await super().start()


def test_health_not_serving_until_models_load(engine):
    gate = threading.Event()
    harness = Harness(GatedBackend(engine, gate))
    try:
        client = harness.client
        assert client.health("") == client.health(SERVICE) == "NOT_SERVING"
        assert not client.model_info().ready
        with pytest.raises(grpc.RpcError) as err:
            client.generate(PROMPT, max_new_tokens=2)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        gate.set()
        client.wait_ready(timeout=30)
        assert client.health("") == client.health(SERVICE) == "SERVING"
        assert client.model_info().ready
        assert client.generate(PROMPT, strategy="streaming", max_new_tokens=2).usage.completion_tokens > 0
    finally:
        gate.set()
        harness.close()


def test_cancelled_stream_leaves_no_request_state(served, slow):
    events = served.client.stream(
        PROMPT, strategy="streaming", params={"window": 2}, max_new_tokens=64, request_id="c1"
    )
    next(events)
    assert served.backend.live() == ["c1"] and holds_state(served.backend, "c1")
    events.close()  # cancels the call
    assert gone(served.backend, "c1")


def test_deadline_stops_decoding(served, slow):
    client = DlmClient(f"127.0.0.1:{served.port}", timeout=0.3)
    with client, pytest.raises(grpc.RpcError) as err:
        client.generate(PROMPT, strategy="streaming", params={"window": 2}, max_new_tokens=64, request_id="d1")
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert gone(served.backend, "d1")


def test_a_deadline_sends_the_text_held_back_before_deadline_exceeded(served, engine, slow, monkeypatch):
    """A request that asked for its last chunk inside the Complete, ended by its deadline: the text held back until
    then (here all of it: a stop sequence that the whole text begins) comes in a last chunk of its own, then
    DEADLINE_EXCEEDED, as there is no Complete to carry it."""
    text = engine.generate(PROMPT, "streaming", {"window": 2}, 32).text
    to_spec = grpc_server.to_spec
    soon = lambda request, limits, _: to_spec(request, limits, time.monotonic() + 0.5)  # noqa: E731
    monkeypatch.setattr(grpc_server, "to_spec", soon)  # the server's deadline, well before the client's
    request = DlmClient.request(PROMPT, strategy="streaming", params={"window": 2}, max_new_tokens=32)
    request.stop.append(text[:63] + "\x00")
    request.last_chunk_in_complete = True
    messages = []
    with pytest.raises(grpc.RpcError) as err:
        messages.extend(served.client.stub.GenerateStream(request, timeout=30))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert {m.WhichOneof("event") for m in messages} == {"chunk"}
    *before, held = [m.chunk.text for m in messages]
    assert not any(before)  # the rounds' chunks carry their token ids, their text held back
    assert held and len(held) < len(text) and text.startswith(held)


def test_duplicate_live_request_id(served, slow):
    events = served.client.stream(PROMPT, strategy="streaming", params={"window": 2}, max_new_tokens=64, request_id="x")
    next(events)
    with pytest.raises(grpc.RpcError) as err:
        served.client.generate(PROMPT, max_new_tokens=2, request_id="x")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    events.close()
    assert gone(served.backend, "x")


def test_decoding_error_is_internal_and_server_goes_on(served, monkeypatch):
    def failing(req, stages):
        yield from ()
        raise RuntimeError("boom")

    monkeypatch.setattr(engine_module, "one_round", failing)
    with pytest.raises(grpc.RpcError) as err:
        served.client.generate(PROMPT, strategy="streaming", max_new_tokens=4)
    assert err.value.code() == grpc.StatusCode.INTERNAL and "boom" in err.value.details()
    monkeypatch.undo()
    assert served.client.generate(PROMPT, strategy="streaming", max_new_tokens=2).usage.completion_tokens > 0
    assert served.backend.live() == []


def test_concurrent_streams(served, engine):
    prompts = ["count from 1 to 9:", "copy: the quick brown fox", "sort 5 3 9 1:", "def add(a, b):"]
    jobs = [(prompts[i % 4], ["streaming", "slot"][i % 2], i) for i in range(8)]
    expected = [engine.generate(p, s, SMALL[s], 12, SamplingParams(seed=seed)).text for p, s, seed in jobs]

    def run(job):
        prompt, strategy, seed = job
        return collect(
            served.client.stream(prompt, strategy=strategy, params=SMALL[strategy], max_new_tokens=12, seed=seed)
        )

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs))
    assert [text for text, *_ in results] == expected
    assert all(done.finish_reason != pb.FINISH_REASON_UNSPECIFIED for *_, done in results)
    assert served.backend.live() == []


def test_stop_sequence_cuts_text(served, engine):
    kwargs = dict(strategy="ar", params={"model": "guider"}, max_new_tokens=16, **SAMPLING)
    full = engine.generate(PROMPT, "ar", {"model": "guider"}, 16, SamplingParams(**SAMPLING)).text
    # a two-character stop first found past the start, so that the cut keeps some text
    stop = next(full[i : i + 2] for i in range(3, len(full) - 1) if full.find(full[i : i + 2]) >= 3)
    unary = served.client.generate(PROMPT, **{**kwargs, "stop": ["never there", stop]})
    text, ids, _, done = collect(served.client.stream(PROMPT, **{**kwargs, "stop": ["never there", stop]}))
    assert text == unary.text == full[: full.find(stop)] and len(text) >= 3
    assert done.finish_reason == unary.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert ids == list(unary.token_ids) and stop in engine.decode_text(ids)
    assert stop not in engine.decode_text(ids[:-1])  # token ids end with the token that completed the stop
    assert done.usage.completion_tokens == len(ids)


def test_stop_token_id_ends_the_output_after_it(served, engine):
    kwargs = dict(strategy="ar", params={"model": "guider"}, max_new_tokens=16, **SAMPLING)
    full = engine.generate(PROMPT, "ar", {"model": "guider"}, 16, SamplingParams(**SAMPLING)).token_ids
    stop_id = full[5]
    cut = full[: full.index(stop_id) + 1]
    unary = served.client.generate(PROMPT, **kwargs, stop_token_ids=[stop_id])
    assert list(unary.token_ids) == cut and unary.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert unary.text == engine.decode_text(cut) and unary.usage.completion_tokens == len(cut)


def test_unset_seed_is_fresh_and_returned(served):
    kwargs = dict(strategy="ar", params={"model": "guider"}, max_new_tokens=16, temperature=1.0)
    first, second = (served.client.generate(PROMPT, **kwargs) for _ in range(2))
    assert first.seed != second.seed and first.token_ids != second.token_ids
    again = served.client.generate(PROMPT, **kwargs, seed=first.seed)
    assert again.token_ids == first.token_ids and again.seed == first.seed


def test_abort_cancels_a_live_stream(served, slow):
    stream = served.client.stream(PROMPT, strategy="streaming", max_new_tokens=64, request_id="abort-me")
    next(stream)
    assert served.client.abort("abort-me") and not served.client.abort("no-such-request")
    *_, done = stream
    assert done.finish_reason == pb.FINISH_REASON_CANCELLED
    assert gone(served.backend, "abort-me")


def test_list_strategies_and_model_info(served, engine):
    listed = served.client.strategies()
    assert set(listed) == set(STRATEGIES)
    for name, cls in STRATEGIES.items():
        assert listed[name] == pytest.approx(defaults(name))
        assert set(getattr(pb.StrategyParams(), name).DESCRIPTOR.fields_by_name) == {f.name for f in fields(cls)}
    info = served.client.model_info()
    assert {m.role: m.path for m in info.models} == engine.config.models
    assert info.vocab_size == len(engine.tokenizer) and info.max_context == 512
    assert (info.device, info.dtype, info.limits.max_new_tokens) == ("cpu", "float32", 64)


def test_shutdown_completes_live_streams_as_cancelled(engine, slow):
    harness = Harness(backend(engine))
    harness.client.wait_ready()
    events = harness.client.stream(
        PROMPT, strategy="streaming", params={"window": 2}, max_new_tokens=64, request_id="s"
    )
    next(events)
    stopping = threading.Thread(target=harness.call, args=(harness.server.stop(5),))
    stopping.start()
    *_, done = collect(events)
    stopping.join()
    assert done.finish_reason == pb.FINISH_REASON_CANCELLED
    assert harness.backend.live() == [] and not holds_state(harness.backend, "s")
    harness.client.close()
    harness.loop.call_soon_threadsafe(harness.loop.stop)


def cli_args(**kw) -> argparse.Namespace:
    base = dict(
        strategy=None, set=[], max_new_tokens=None, seed=0, temperature=0.0, top_p=1.0, json=False, stop=[], stats=False
    )
    return argparse.Namespace(**{**base, **kw})


def test_generate_logprobs_in_process_and_remote_agree(served, engine, capsys, tmp_path):
    from services.cli.cli import main

    config = tmp_path / "dlm.yaml"
    config.write_text(json.dumps({"engine": {"models": engine.config.models}}))
    argv = ["--config", str(config), "generate", PROMPT, "--strategy", "pipeline", "--set", "window=6"]
    assert main([*argv, "--max-new-tokens", "10", "--logprobs", "2", "--json"]) == 0
    local = json.loads(capsys.readouterr().out.splitlines()[-1])
    args = cli_args(target=f"127.0.0.1:{served.port}", prompt=PROMPT, strategy="pipeline", set=["window=6"])
    args.max_new_tokens, args.json, args.logprobs = 10, True, 2
    assert generate_remote(args) == 0
    remote = json.loads(capsys.readouterr().out)
    assert [e["token_id"] for e in remote["logprobs"]] == remote["token_ids"] == local["token_ids"]
    # follow=drafter: the drafter's distribution, not the guider's
    assert all(not e["verified"] and len(e["top"]) == 2 for e in remote["logprobs"])
    remote_lps, local_lps = (
        [v for e in out["logprobs"] for v in (e["logprob"], *dict(e["top"]).values())] for out in (remote, local)
    )
    assert remote_lps == pytest.approx(local_lps, abs=1e-5)


def test_remote_generate_json_matches_in_process(served, engine, capsys):
    args = cli_args(
        target=f"127.0.0.1:{served.port}", prompt=PROMPT, strategy="slot", set=["slot_size=4", "block_size=8"]
    )
    args.max_new_tokens, args.json = 12, True
    assert generate_remote(args) == 0
    out = json.loads(capsys.readouterr().out)
    expected = engine.generate(PROMPT, "slot", SMALL["slot"], 12)
    assert (out["text"], out["token_ids"], out["finish_reason"]) == (
        expected.text,
        expected.token_ids,
        expected.finish_reason,
    )
    assert set(out["stats"]) == {
        "rounds",
        "drafter_forwards",
        "guider_forwards",
        "filter_calls",
        "model_forwards",
        "tokens",
        "tpf",
        "tokens_per_forward",
        "p_cache",
        "accepted_per_round",
        "ttft_s",
        "wall_s",
    }
    bad = cli_args(target=f"127.0.0.1:{served.port}", prompt=PROMPT, strategy="streaming", set=["window=0"])
    assert generate_remote(bad) == 2
    assert "window" in capsys.readouterr().err


def test_remote_generate_takes_stop_and_seed_like_in_process(served, engine, tmp_path, capsys):
    config = tmp_path / "dlm.yaml"
    config.write_text(yaml.safe_dump({"engine": {"models": engine.config.models}}))
    target = ["--target", f"127.0.0.1:{served.port}"]
    argv = ["generate", "--strategy", "slot", "--set", "slot_size=4", "--set", "block_size=8", "--json"]
    argv += ["--max-new-tokens", "12", "--temperature", "0.7", "--seed", "5"]
    assert main(["--config", str(config), *argv, *target, PROMPT]) == 0
    stop = json.loads(capsys.readouterr().out)["text"][2:4]
    outs = []
    for where in ([], target):
        assert main(["--config", str(config), *argv, *where, "--stop", stop, PROMPT]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    local, remote = outs
    assert remote["finish_reason"] == "stop_sequence" and stop not in remote["text"] and remote["seed"] == 5
    assert {k: local[k] for k in ("text", "token_ids", "finish_reason", "seed")} == {
        k: remote[k] for k in ("text", "token_ids", "finish_reason", "seed")
    }


def test_remote_bench(served, tmp_path, tiny_zoo, capsys):
    out = tmp_path / "bench.json"
    args = argparse.Namespace(
        target=f"127.0.0.1:{served.port}",
        concurrency="1,2",
        max_new_tokens=4,
        strategy="streaming",
        json=str(out),
        plot=None,
        breakdown=True,
        config=write_config(tmp_path, tiny_zoo),  # the served models' shapes, for MFU's reference matmul
    )
    assert bench_remote(args) == 0
    rows = json.loads(out.read_text())
    assert [r["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        assert row["tokens_per_s"] > 0 and row["requests_per_s"] > 0
        assert row["latency_p50_s"] <= row["latency_p90_s"] <= row["latency_p99_s"]
        assert row["ttft_mean_s"] > 0
        assert 0 < row["mfu"] < 1
        parts = row["breakdown"]  # from each Complete's RoundTrace rows
        assert 0 < parts["round"]["mean"] <= row["ms_per_round"]  # a step, within what a client waits per round
        assert parts["round"]["mean"] == pytest.approx(
            parts["orchestrator"]["mean"] + parts["hops"]["mean"] + parts["queue"]["mean"] + parts["busy"]["mean"]
        )
        assert parts["compute drafter"]["mean"] > 0 and parts["hops"]["mean"] > 0
        per = row["per_request"]  # a request's rounds, and its way in and out over gRPC around them
        assert 0 < per["in rounds"]["mean"] < per["latency"]["mean"]
        assert per["latency"]["mean"] == pytest.approx(per["in rounds"]["mean"] + per["outside rounds"]["mean"])
        outside = ("before first round", "between rounds", "way in and out")  # from the rounds' times of emission
        assert per["outside rounds"]["mean"] == pytest.approx(sum(per[part]["mean"] for part in outside))
        assert per["before first round"]["mean"] > 0 and per["way in and out"]["mean"] > 0
        assert per["between rounds"]["mean"] >= 0
