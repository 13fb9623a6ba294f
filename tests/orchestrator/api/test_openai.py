"""The OpenAI-compatible API end to end: a local Ray, the Serve app on the shipped zoo with its HTTP proxy on a free
port, the official `openai` client over loopback beside gRPC and the in-process engine; Abort and logprobs over gRPC."""

import json
import time
import urllib.error
import urllib.request

import pytest
import yaml

from services.cli.client import DlmClient
from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.sampling import SamplingParams
from services.orchestrator.engine.engine import Engine
from services.serving.ray_env import set_ray_env
from services.serving.wire import pb
from services.training.engine_eval import guider_nll
from tests.orchestrator.cluster.test_services import free_port

pytestmark = pytest.mark.e2e

PROMPT = "sort: 58 68 49 27 13 91 67"
SAMPLED = {"temperature": 0.8, "seed": 7}
OPEN_ENDED = "tell me something"  # off the tasks: the AR baseline samples different text per seed


@pytest.fixture(scope="module")
def service(tmp_path_factory, redis_url):
    """(openai client, HTTP base URL, gRPC client, Serve app handle, in-process engine) on the shipped zoo."""
    openai = pytest.importorskip("openai")
    ray = pytest.importorskip("ray")
    from ray import serve

    from services.orchestrator.cluster.app import build_app

    zoo = EngineConfig.from_yaml(DEFAULT_CONFIG).models
    port, http_port = free_port(), free_port()
    config = tmp_path_factory.mktemp("openai") / "dlm.yaml"
    serving = {"port": port, "http_port": http_port, "micro_batches": 1, "redis_url": redis_url}
    config.write_text(yaml.safe_dump({"engine": {"models": zoo, "max_new_tokens": 32, "serving": serving}}))
    set_ray_env()
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    app = serve.run(build_app({"config": str(config)}), name="dlm", route_prefix="/")
    base = f"http://127.0.0.1:{http_port}"
    grpc_client = DlmClient(f"127.0.0.1:{port}", timeout=120)
    deadline = time.monotonic() + 180
    while post(f"{base}/health", None)[0] != 200:
        assert time.monotonic() < deadline, "the HTTP API never became healthy"
        time.sleep(0.5)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120, max_retries=0)
    yield client, base, grpc_client, app, Engine(EngineConfig.from_yaml(str(config)))
    client.close()
    grpc_client.close()
    serve.shutdown()
    ray.shutdown()


def post(url: str, body: dict | None) -> tuple[int, dict]:
    """POST body as JSON (GET without one) -> (status, JSON reply)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body.startswith(b"{") else {"text": body.decode()}


def chat(client, content: str, **kw):
    return client.chat.completions.create(model="dlm", messages=[{"role": "user", "content": content}], **kw)


def test_openai_client_texts_equal_grpc_and_in_process(service):
    client, _, grpc_client, _, engine = service
    local = engine.generate(PROMPT, max_new_tokens=24, sampling=SamplingParams(**SAMPLED))
    unary = grpc_client.generate(PROMPT, max_new_tokens=24, **SAMPLED)
    assert unary.text == local.text and unary.seed == 7

    reply = chat(client, PROMPT, max_tokens=24, **SAMPLED)
    assert reply.choices[0].message.content == local.text
    assert reply.model_extra["seed"] == 7 and reply.model_extra["dlm_stats"]["rounds"] > 0
    prompt_tokens = len(engine.encode(PROMPT))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_tokens, len(unary.token_ids))
    assert reply.usage.total_tokens == prompt_tokens + len(unary.token_ids)

    chunks = list(chat(client, PROMPT, max_tokens=24, stream=True, stream_options={"include_usage": True}, **SAMPLED))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == local.text
    assert chunks[-2].choices[0].finish_reason == {"eos": "stop", "length": "length"}[local.finish_reason]
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == len(unary.token_ids)

    # completions take the prompt as is: no chat template
    raw = engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    completion = client.completions.create(model="dlm", prompt=PROMPT, max_tokens=12, **SAMPLED)
    assert completion.choices[0].text == grpc_client.generate(raw, max_new_tokens=12, **SAMPLED).text
    local = engine.generate(raw, max_new_tokens=12, sampling=SamplingParams(**SAMPLED))
    assert completion.choices[0].text == local.text
    assert completion.usage.prompt_tokens == len(raw)


MESSAGES = [{"role": "user", "content": PROMPT}]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"messages": MESSAGES, "strategy": "nope"}, "strategy"),
        ({"messages": MESSAGES, "strategy": "streaming", "dlm_params": {"window": -1}}, "dlm_params"),
        ({"messages": MESSAGES, "strategy": "streaming", "dlm_params": {"window": "wide"}}, "dlm_params"),
        ({"messages": MESSAGES, "n": 2}, "n"),
    ],
)
def test_bad_input_is_an_openai_400_naming_the_field(service, body, param):
    _, base, *_ = service
    status, reply = post(f"{base}/v1/chat/completions", {"model": "dlm", **body})
    assert status == 400, reply
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error"
    assert param.split(".")[0] in reply["error"]["message"] or param == "dlm_params"
    status, reply = post(f"{base}/v1/chat/completions", {"model": "dlm", "messages": MESSAGES, "max_tokens": 4})
    assert status == 200 and reply["choices"][0]["message"]["content"]  # the server goes on


def test_unknown_model_is_404_and_models_lists_ours(service):
    client, base, *_ = service
    status, reply = post(f"{base}/v1/completions", {"model": "gpt-4", "prompt": PROMPT})
    assert status == 404 and reply["error"]["param"] == "model"
    assert [m.id for m in client.models.list()] == ["dlm"]


def test_completion_stream_is_sse_ending_with_done(service):
    _, base, *_ = service
    body = {"model": "dlm", "prompt": PROMPT, "max_tokens": 6, "stream": True, "temperature": 0}
    req = urllib.request.Request(
        f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        events = reply.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    fields = [dict(line.split(": ", 1) for line in e.split("\n")) for e in events[:-2]]  # id: ...\ndata: ...
    chunks = [json.loads(f["data"]) for f in fields]
    assert all(c["object"] == "text_completion.chunk" for c in chunks)
    assert all(f["id"].startswith(f"{c['id']}:") for f, c in zip(fields, chunks, strict=True))
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length") and chunks[-1]["seed"] >= 0


def test_unset_seeds_differ_and_each_returned_seed_reproduces_its_text(service):
    client, _, grpc_client, *_ = service
    ar = {"strategy": "ar", "dlm_params": {"model": "ar"}}
    replies = [chat(client, OPEN_ENDED, max_tokens=16, temperature=1.0, extra_body=ar) for _ in range(2)]
    texts = [r.choices[0].message.content for r in replies]
    seeds = [r.model_extra["seed"] for r in replies]
    assert texts[0] != texts[1] and seeds[0] != seeds[1]
    for text, seed in zip(texts, seeds, strict=True):
        again = chat(client, OPEN_ENDED, max_tokens=16, temperature=1.0, seed=seed, extra_body=ar)
        assert again.choices[0].message.content == text
    unary = grpc_client.generate(OPEN_ENDED, strategy="ar", params={"model": "ar"}, max_new_tokens=16, temperature=1.0)
    assert (
        grpc_client.generate(
            OPEN_ENDED, strategy="ar", params={"model": "ar"}, max_new_tokens=16, temperature=1.0, seed=unary.seed
        ).text
        == unary.text
    )


@pytest.mark.parametrize("prompt", ["add 366+558=", PROMPT])
def test_logprobs_sum_to_the_guider_nll_of_the_output(service, prompt):
    """`ar --model guider` decides every token by the guider: its logprobs are the scores `dlm eval` sums."""
    client, _, grpc_client, _, engine = service
    reply = grpc_client.generate(prompt, strategy="ar", params={"model": "guider"}, max_new_tokens=32, logprobs=3)
    assert reply.finish_reason == pb.FINISH_REASON_EOS  # guider_nll scores the output and its EOS
    assert [lp.token_id for lp in reply.logprobs] == list(reply.token_ids)
    assert all(lp.top[0].token_id == lp.token_id and len(lp.top) == 3 for lp in reply.logprobs)  # greedy
    nll, scored = guider_nll(engine, engine.encode(prompt), list(reply.token_ids[:-1]))
    assert scored == len(reply.logprobs)
    assert abs(-sum(lp.logprob for lp in reply.logprobs) - nll) < 1e-4

    ar = {"strategy": "ar", "dlm_params": {"model": "guider"}}
    http = chat(client, prompt, max_tokens=32, temperature=0, logprobs=True, top_logprobs=2, extra_body=ar)
    content = http.choices[0].logprobs.content
    assert abs(-sum(t.logprob for t in content) - nll) < 1e-4 and all(len(t.top_logprobs) == 2 for t in content)


def test_pipeline_logprobs_say_which_model_decided(service):
    _, _, grpc_client, *_ = service
    speculative = {"follow": "guider"}  # the guider's tokens; by default the pipeline outputs the drafter's
    reply = grpc_client.generate(PROMPT, strategy="pipeline", params=speculative, max_new_tokens=16, logprobs=1)
    assert len(reply.logprobs) == len(reply.token_ids) and all(lp.verified for lp in reply.logprobs)
    for strategy in ("pipeline", "streaming"):
        reply = grpc_client.generate(PROMPT, strategy=strategy, max_new_tokens=16, logprobs=1)
        assert len(reply.logprobs) == len(reply.token_ids) and not any(lp.verified for lp in reply.logprobs)


def test_abort_ends_a_running_stream_as_cancelled_and_frees_its_state(service):
    _, _, grpc_client, app, _ = service
    long = {"strategy": "pipeline", "params": {"window": 4}, "temperature": 1.5, "seed": 3}
    stream = grpc_client.stream(OPEN_ENDED, max_new_tokens=400, request_id="aborted", **long)
    next(stream)  # decoding has started
    assert grpc_client.abort("aborted") and not grpc_client.abort("never-seen")
    events = list(stream)
    assert events[-1].finish_reason == pb.FINISH_REASON_CANCELLED and events[-1].usage.completion_tokens < 400
    deadline = time.monotonic() + 1.0
    while True:
        live = app.live.remote().result()
        holders = [live[role] for role in ("drafter", "guider", "ar")]
        if not live["orchestrator"] and not any(holders) and not [k for k in live["index"] if "aborted" in k]:
            break
        assert time.monotonic() < deadline, f"state left after Abort: {live}"
        time.sleep(0.05)
