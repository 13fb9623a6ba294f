"""The distributed pipeline end to end: a local Ray, the Serve app on tiny models, gRPC over loopback."""

import contextlib
import os
import signal
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import yaml

from services.cli.client import DlmClient
from services.cli.remote_cli import load_level
from services.cli.serve import index_redis
from services.common.config import EngineConfig, ServingConfig
from services.common.sampling import SamplingParams
from services.orchestrator.engine.engine import Engine
from services.serving.ray_env import set_ray_env
from services.serving.redis_process import free_port
from tests.replica_processes import cluster_replica_pids, forward_threads

pytestmark = pytest.mark.e2e

CASES = {
    "guided": {"block_size": 8},
    "slot": {"slot_size": 4, "block_size": 8},
    "streaming": {"window": 6},
    "pipeline": {"window": 6},
    "learn2pd": {"block_size": 8},  # the bidirectional drafter's filter, beside pipeline's causal one
    "credit": {"drafter": "causal", "block_size": 8},  # its gate's [block, V] scores stay with the engine
    "ar": {},  # its next token drawn on the AR model's replica
}
SEEDED = ("guided", "slot", "streaming", "pipeline", "ar")  # sixteen_streams_equal_in_process's
PROMPT = "count from 1 to 9:"


@contextlib.contextmanager
def served_app(engine: dict, config_path, num_cpus: int = 4, http_port: int | None = None):
    """A local Ray and the Serve app on this engine config (gRPC on a free loopback port), SERVING -> (client, app).
    Without serving.redis_url its cache index is on a redis-server started here, as `dlm serve` starts one. http_port:
    the Serve HTTP proxy's loopback port, where the OpenAI API is served (None: no HTTP)."""
    serving = ServingConfig(**engine.get("serving", {}))
    with index_redis(serving):
        engine = {**engine, "serving": {**engine.get("serving", {}), "redis_url": serving.redis_url}}
        with served_app_on(engine, config_path, num_cpus, http_port) as served:
            yield served


@contextlib.contextmanager
def served_app_on(engine: dict, config_path, num_cpus: int, http_port: int | None = None):
    ray = pytest.importorskip("ray")
    from ray import serve

    from services.orchestrator.cluster.app import build_app

    set_ray_env()
    # a cluster of its own, not the newest one on the machine (ray.init() would join that)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR")
    port = free_port()  # below the ephemeral range: no connection of Ray's takes it before the app binds it
    engine = {**engine, "serving": {**engine.get("serving", {}), "port": port}}
    config_path.write_text(yaml.safe_dump({"engine": engine}))
    client = DlmClient(f"127.0.0.1:{port}", timeout=120)
    try:
        if http_port is not None:
            serve.start(http_options={"host": "127.0.0.1", "port": http_port})
        prefix = None if http_port is None else "/"
        app = serve.run(build_app({"config": str(config_path)}), name="dlm", route_prefix=prefix)
        deadline = time.monotonic() + 180
        while client.health() != "SERVING":
            assert time.monotonic() < deadline, "the service never became SERVING"
            time.sleep(0.5)
        yield client, app
    finally:
        client.close()
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def service(redis_url, tiny_zoo, tmp_path_factory):
    """The app on tiny models, its cache index on the redis-server the suite starts."""
    serving = {"redis_url": redis_url}
    config = tmp_path_factory.mktemp("svc") / "dlm.yaml"
    with served_app({"models": tiny_zoo, "max_new_tokens": 16, "serving": serving}, config) as (client, app):
        yield client, app, Engine(EngineConfig.from_yaml(str(config)))


def streamed(client, strategy: str, params: dict, **kw) -> tuple[list[int], str]:
    ids, text = [], ""
    for event in client.stream(PROMPT, strategy=strategy, params=params, max_new_tokens=16, **kw):
        if hasattr(event, "text") and hasattr(event, "token_ids") and not hasattr(event, "finish_reason"):
            ids.extend(event.token_ids)
            text += event.text
    return ids, text


@pytest.mark.parametrize("strategy", list(CASES))
def test_stream_equals_unary_equals_in_process(service, strategy):
    client, _, engine = service
    params = CASES[strategy]
    local = engine.generate(PROMPT, strategy, params, 16)
    unary = client.generate(PROMPT, strategy=strategy, params=params, max_new_tokens=16)
    ids, text = streamed(client, strategy, params)
    assert list(unary.token_ids) == local.token_ids == ids
    assert unary.text == local.text == text


def test_logprobs_served_equal_in_process(service):
    """A request's logprobs so far stay with the engine (services/serving/pickling.py: ENGINE_ONLY); each round's
    still come back from the replica that decided its tokens."""
    client, _, engine = service
    req = engine.request(PROMPT, 16, SamplingParams(logprobs=2))
    local = [lp for out in engine.stream(req, "pipeline", CASES["pipeline"]) for lp in out.logprobs]
    reply = client.generate(PROMPT, strategy="pipeline", params=CASES["pipeline"], max_new_tokens=16, logprobs=2)
    assert [e.token_id for e in reply.logprobs] == list(reply.token_ids) == req.output_ids()
    assert [e.logprob for e in reply.logprobs] == pytest.approx([lp.logprob for lp in local], abs=1e-5)
    assert [[t.token_id for t in e.top] for e in reply.logprobs] == [[t for t, _ in lp.top] for lp in local]


def test_concurrent_streams_batch_on_the_drafter(service):
    client, app, engine = service
    expected = engine.generate(PROMPT, "streaming", CASES["streaming"], 16).token_ids
    results = [None] * 8

    def run(i: int) -> None:
        results[i] = streamed(client, "streaming", CASES["streaming"])[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r == expected for r in results)
    sizes = app.batch_sizes.remote().result()["drafter"]
    assert max(int(k) for k in sizes) > 1, sizes


def test_a_served_round_breaks_down_into_the_replicas_compute_and_the_hops(service):
    client, _, _ = service
    kwargs = dict(strategy="pipeline", params={"window": 6}, max_new_tokens=16)
    row, steps = load_level(client, 2, [PROMPT], kwargs)
    assert len(steps) == row.tokens / row.tpf  # every round came back with its step's timing
    for t in steps:  # timed on the replicas, brought back with their replies
        assert set(t.compute_s) == {"drafter", "guider", "filter"} and t.flops["drafter"] > 0
        assert t.orchestrator_s > 0 and t.hops_s > 0 and t.busy_s > 0 and t.queue_s >= 0
        computes = t.compute_s.values()
        # the guider's and the filter's calls go out together: any two of the three may overlap, so overlap is
        # bounded by what the hosts computed beyond the longest, not by the shortest
        assert max(computes) <= t.busy_s + 1e-9 and t.overlap_s <= sum(computes) - max(computes) + 1e-9
        assert all(0 < t.cpu_s[h] <= t.compute_s[h] + 1e-3 for h in t.compute_s)  # each replica's host thread
    assert statistics.fmean(t.round_s for t in steps) <= row.ms_per_round / 1000  # within what a client waits


def test_cancelled_stream_leaves_no_state(service):
    client, app, _ = service
    stream = client.stream(PROMPT, strategy="pipeline", params={"window": 4}, max_new_tokens=400, request_id="gone")
    next(stream)  # decoding has started
    assert "gone" in app.live.remote().result()["drafter"]
    stream.close()  # cancels the call
    deadline = time.monotonic() + 1.0
    while True:
        live = app.live.remote().result()
        holders = [live[role] for role in ("drafter", "guider", "ar")]
        if not live["orchestrator"] and not any(holders) and not [k for k in live["index"] if "gone" in k]:
            break
        assert time.monotonic() < deadline, f"state left after cancellation: {live}"
        time.sleep(0.05)


def test_index_tracks_a_live_request_and_forgets_it(service):
    client, app, _ = service
    stream = client.stream(
        PROMPT, strategy="slot", params={"slot_size": 4, "block_size": 8}, max_new_tokens=64, request_id="tracked"
    )
    next(stream)
    assert [k for k in app.live.remote().result()["index"] if "tracked" in k]
    list(stream)  # runs to completion
    deadline = time.monotonic() + 1.0
    while [k for k in app.live.remote().result()["index"] if "tracked" in k]:
        assert time.monotonic() < deadline, "index keys left after completion"
        time.sleep(0.05)


def test_bad_request_gets_invalid_argument_and_service_goes_on(service):
    client, _, _ = service
    with pytest.raises(grpc.RpcError) as err:
        client.generate(PROMPT, strategy="streaming", params={"window": 0}, max_new_tokens=16)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "window" in err.value.details()
    assert len(client.generate(PROMPT, strategy="streaming", max_new_tokens=8).token_ids) > 0


def replica_pid(deployment: str) -> int:
    [pid] = cluster_replica_pids(deployment)
    return pid


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_each_model_replica_computes_on_its_configured_threads(service):
    """Set on the thread that runs the forwards: Ray gives a worker OMP_NUM_THREADS of its reserved CPUs."""
    assert forward_threads("drafter") == forward_threads("guider") == {ServingConfig().replica_threads}


def sixteen_streams_equal_in_process(client, engine: Engine, first_seed: int) -> None:
    """16 concurrent streams of five strategies, seeded, against the same requests in process."""
    jobs = [(SEEDED[i % len(SEEDED)], dict(temperature=0.8, top_p=0.95, seed=first_seed + i)) for i in range(16)]
    eos = engine.executor.meta().eos_id
    results = [engine.generate(PROMPT, s, CASES[s], 16, SamplingParams(**sampling)) for s, sampling in jobs]
    expected = [r.token_ids + ([eos] if r.finish_reason == "eos" else []) for r in results]  # a stream sends its EOS
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda job: streamed(client, job[0], CASES[job[0]], **job[1])[0], jobs))
    assert got == expected


def test_sixteen_concurrent_streams_equal_in_process(service):
    client, _, engine = service
    sixteen_streams_equal_in_process(client, engine, first_seed=200)


@pytest.mark.parametrize(
    "variant, base",
    [
        ({"overlap": True}, {"overlap": False}),
        ({"overlap": True, "guesses": 16}, {"overlap": False}),
        ({"follow": "guider", "lookahead": 3}, {"follow": "guider"}),
    ],
    ids=["overlap", "guesses", "lookahead"],
)
def test_sixteen_streams_drafting_and_verifying_at_once_equal_in_process_without(service, variant, base):
    """pipeline with overlap=true (guessing the whole window, or every count), or following the guider with
    lookahead=3, served at c=16, greedy and seeded: token for token the same without, in process."""
    client, _, engine = service
    on, off = {**CASES["pipeline"], **variant}, {**CASES["pipeline"], **base}
    samplings = [{} if i % 2 else dict(temperature=0.8, seed=300 + i) for i in range(16)]
    eos = engine.executor.meta().eos_id
    results = [engine.generate(PROMPT, "pipeline", off, 16, SamplingParams(**s)) for s in samplings]
    expected = [r.token_ids + ([eos] if r.finish_reason == "eos" else []) for r in results]  # a stream sends its EOS
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda s: streamed(client, "pipeline", on, **s)[0], samplings))
    assert got == expected


def test_sixty_four_streams_complete_on_a_bounded_number_of_threads(service):
    client, app, _ = service
    pid = replica_pid("orchestrator")
    before, peak, done = threads(pid), 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, threads(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(64) as pool:
            results = list(pool.map(lambda _: streamed(client, "streaming", CASES["streaming"])[0], range(64)))
    finally:
        done.set()
        sampler.join()
    assert len(results) == 64 and all(results)
    assert peak - before <= 8, f"orchestrator threads grew from {before} to {peak} with 64 streams"
    assert app.requests.remote().result() == []


def test_deadline_passes_while_a_replica_is_stalled(service):
    client, app, _ = service
    drafter = replica_pid("drafter")
    os.kill(drafter, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with DlmClient(client.target, timeout=2.0) as hurried, pytest.raises(grpc.RpcError) as err:
            hurried.generate(PROMPT, strategy="streaming", params=CASES["streaming"], max_new_tokens=16)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        while app.requests.remote().result():  # the orchestrator let go of it, the replica still stopped
            assert time.monotonic() - start < 3.0, "the request outlived its deadline + 1 s in the orchestrator"
            time.sleep(0.05)
    finally:
        os.kill(drafter, signal.SIGCONT)
    assert len(client.generate(PROMPT, strategy="streaming", max_new_tokens=8).token_ids) > 0


@pytest.fixture
def redis_process_of(service, redis_process):
    """The redis-server behind the service's index; running again after the test."""
    server = redis_process
    yield server
    if server.proc is None:
        server.start()


def index_keys(url: str, words: list[str]) -> list[str]:
    import redis

    with redis.Redis.from_url(url) as r:
        return [k.decode() for k in r.scan_iter() if any(w in k.decode() for w in words)]


def test_redis_restarted_mid_run(service, redis_process_of):
    """8 streams run while Redis stops and starts again (empty): they end with the undisturbed text, the
    orchestrator writes the live ones' records again once Redis is back, and no key of theirs is left."""
    client, app, _ = service
    server, params, n = redis_process_of, CASES["streaming"], 64
    samplings = [dict(temperature=0.8, top_p=0.95, seed=500 + i) for i in range(8)]
    ids, results = [f"restarted-{i}" for i in range(8)], [None] * 8
    started = [threading.Event() for _ in range(8)]

    def run(i: int) -> None:
        got = []
        for event in client.stream(
            PROMPT, strategy="streaming", params=params, max_new_tokens=n, request_id=ids[i], **samplings[i]
        ):
            if hasattr(event, "token_ids") and not hasattr(event, "finish_reason"):
                got.extend(event.token_ids)
                started[i].set()
        results[i] = got

    calm = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in calm:
        t.start()
    for t in calm:
        t.join(120)
    undisturbed, started = list(results), [threading.Event() for _ in range(8)]
    streams = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in streams:
        t.start()
    assert all(e.wait(60) for e in started)
    drafter = replica_pid("drafter")
    server.stop()
    time.sleep(0.1)  # rounds go on while Redis is down
    os.kill(drafter, signal.SIGSTOP)  # holds the streams mid-run across the restart
    try:
        live = app.requests.remote().result()
        assert live, "every stream ended before Redis came back: nothing to re-write"
        server.start()
        deadline = time.monotonic() + 5.0
        while {rid for rid in live if not index_keys(server.url, [rid])}:
            assert time.monotonic() < deadline, f"records not written again: {index_keys(server.url, live)}"
            time.sleep(0.05)
    finally:
        os.kill(drafter, signal.SIGCONT)
    for t in streams:
        t.join(120)
    assert results == undisturbed
    deadline = time.monotonic() + 5.0
    while index_keys(server.url, ids):
        assert time.monotonic() < deadline, f"index keys left: {index_keys(server.url, ids)}"
        time.sleep(0.05)


def test_new_request_gets_unavailable_while_redis_is_down(service, redis_process_of):
    client, _, _ = service
    server = redis_process_of
    server.stop()
    deadline = time.monotonic() + 5.0  # a request before the orchestrator noticed goes on from its own copy
    while True:
        try:
            client.generate(PROMPT, strategy="streaming", max_new_tokens=8)
        except grpc.RpcError as e:
            err = e
            break
        assert time.monotonic() < deadline, "requests were still accepted 5 s after Redis stopped"
        time.sleep(0.1)
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    assert "cache index (Redis at 127.0.0.1:" in err.details() and "unavailable" in err.details()
    server.start()
    deadline = time.monotonic() + 5.0
    while True:
        try:
            assert len(client.generate(PROMPT, strategy="streaming", max_new_tokens=8).token_ids) > 0
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, e
            time.sleep(0.1)
