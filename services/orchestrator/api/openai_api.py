"""The OpenAI-compatible HTTP API (FastAPI, served by the Serve HTTP proxy through `serve.ingress`) over the same
Frontend as gRPC: POST /v1/completions and /v1/chat/completions (JSON, or SSE ending with `data: [DONE]`),
GET /v1/models and /health. Bad input is a 400 in OpenAI's error shape naming the field, never a 500.

A stream resumes as MCP's streamable HTTP does: every SSE event has an `id:` (REQUEST_ID:CHARACTERS:TOKENS, what
the client holds once it has the event), and the same POST again with a `Last-Event-ID` header goes on from there,
on whichever orchestrator the request reaches (frontend.py `resume`), with no character repeated or missing. A
client that did not ask for logprobs, and so never sees token counts, may send REQUEST_ID:CHARACTERS."""

import hmac
import json
import logging
from collections.abc import AsyncIterator
from uuid import uuid4

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from services.common.config import LimitExceeded, Limits
from services.common.proposal import TokenLogprob
from services.common.sampling import SamplingParams, fresh_seed
from services.orchestrator.api.body_errors import invalid_body as body_error
from services.orchestrator.api.deltas import Delta, Deltas
from services.orchestrator.api.frontend import Frontend, Job, Spec
from services.orchestrator.api.openai_protocol import (
    MODEL_ID,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    error,
    now,
    usage,
)
from services.orchestrator.decode.strategies import STRATEGIES, make_params
from services.orchestrator.engine.scheduler import ResourceExhausted, Unavailable
from services.serving.cache_index import IndexUnavailable, OwnerAlive

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # others (cancelled, deadline) keep their names
log = logging.getLogger(__name__)

api = FastAPI(title="dlm-pipeline", description="OpenAI-compatible API of the dlm-pipeline server")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


class Served:
    """What the routes serve. Module state rather than `api.state`: Serve runs a pickled copy of `api` on the
    replica, while this module (and so each route's globals) is imported there by name."""

    backend: Frontend
    limits: Limits
    api_key: str | None = None  # the bearer token /v1 routes require (None: open)


served = Served()


def attach(backend: Frontend, limits: Limits, api_key: str | None = None) -> None:
    """Serve this backend (the replica's, shared with its gRPC server); with api_key, /v1 requires it."""
    served.backend, served.limits, served.api_key = backend, limits, api_key


def authorized(request: Request) -> None:
    """`Authorization: Bearer <api_key>` on every /v1 route when the server has a key (vLLM's --api-key)."""
    if served.api_key is None:
        return
    sent = request.headers.get("authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {served.api_key}".encode()):
        raise APIError(401, "missing or invalid API key (Authorization: Bearer)", kind="authentication_error")


@api.exception_handler(APIError)
async def api_error(request: Request, e: APIError) -> JSONResponse:
    return JSONResponse(error(e.message, e.kind, e.param), status_code=e.status)


@api.exception_handler(RequestValidationError)
async def invalid_body(request: Request, e: RequestValidationError) -> JSONResponse:
    return JSONResponse(body_error(e.errors(), e.body), status_code=400)


def ready_backend() -> Frontend:
    backend = served.backend
    if not backend.ready:
        raise APIError(503, "models are still loading", kind="unavailable_error")
    return backend


@api.get("/health")
async def health() -> dict:
    ready_backend()
    return {"status": "ok"}


@api.get("/v1/models", dependencies=[Depends(authorized)])
async def models() -> dict:
    backend = served.backend
    info = backend.model_info()
    model = {"id": MODEL_ID, "object": "model", "created": now(), "owned_by": "dlm-pipeline"}
    model |= {"max_model_len": info.max_context, "dlm_strategies": sorted(STRATEGIES), "ready": backend.ready}
    return {"object": "list", "data": [model]}


@api.post("/v1/completions", dependencies=[Depends(authorized)])
async def completions(body: CompletionRequest, last_event_id: str | None = Header(None)):
    backend = ready_backend()
    tokenizer = backend.engine.tokenizer
    prompt = body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt, add_special_tokens=False)
    deltas = await start(backend, body, last_event_id, prompt, body.logprobs, body.max_tokens, "cmpl")
    render = CompletionRender(backend, deltas.job, body)
    if body.stream:
        return sse(render.stream(deltas), deltas)
    return await render.whole(deltas)


@api.post("/v1/chat/completions", dependencies=[Depends(authorized)])
async def chat_completions(body: ChatCompletionRequest, last_event_id: str | None = Header(None)):
    backend = ready_backend()
    prompt = backend.engine.encode_chat([m.model_dump() for m in body.messages])
    top_n = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = body.max_completion_tokens or body.max_tokens
    deltas = await start(backend, body, last_event_id, prompt, top_n, max_tokens, "chatcmpl")
    render = ChatRender(backend, deltas.job, body)
    if body.stream:
        return sse(render.stream(deltas), deltas)
    return await render.whole(deltas)


async def start(
    backend: Frontend,
    body: GenerationRequest,
    last_event_id: str | None,
    prompt: list[int],
    top_n: int | None,
    max_tokens: int | None,
    prefix: str,
) -> Deltas:
    """A new request's deltas, or with Last-Event-ID those of a stream that goes on after that event."""
    if last_event_id is None:
        job, chars, tokens = await open_job(backend, served.limits, body, prompt, top_n, max_tokens, prefix), 0, 0
    else:
        request_id, chars, tokens = resume_point(last_event_id, body)
        job = await resume_job(backend, request_id)
    stop_ids = frozenset(body.stop_token_ids)
    return Deltas(job, backend.detokenizer(), body.stops(), stop_ids, held_ids=tokens, held_chars=chars)


def resume_point(last_event_id: str, body: GenerationRequest) -> tuple[str, int, int]:
    """Last-Event-ID -> (request id, characters, token ids) the client holds."""
    if not body.stream:
        raise APIError(400, "Last-Event-ID resumes a stream: set stream to true", "stream")
    request_id, *counts = last_event_id.split(":")
    if not request_id or len(counts) not in (1, 2) or not all(c.isdigit() for c in counts):
        message = f"Last-Event-ID must be REQUEST_ID:CHARACTERS[:TOKENS], as a stream event's id; got {last_event_id!r}"
        raise APIError(400, message, "Last-Event-ID")
    chars, tokens = int(counts[0]), int(counts[1]) if len(counts) == 2 else 0
    return request_id, chars, tokens


async def resume_job(backend: Frontend, request_id: str) -> Job:
    try:
        return await backend.resume(Spec([], request_id=request_id))
    except KeyError as e:
        raise APIError(404, e.args[0], "Last-Event-ID", "not_found_error") from None
    except (OwnerAlive, IndexUnavailable, Unavailable) as e:  # its orchestrator may still be alive: retry
        raise APIError(503, str(e), kind="unavailable_error") from None


async def open_job(
    backend: Frontend,
    limits: Limits,
    body: GenerationRequest,
    prompt: list[int],
    top_n: int | None,
    max_tokens: int | None,
    prefix: str,
) -> Job:
    """Check what the engine does not know about, then queue the request; every refusal is an APIError."""
    if body.model != MODEL_ID:
        raise APIError(404, f"model {body.model!r} does not exist; GET /v1/models lists {MODEL_ID!r}", "model")
    request_id = f"{prefix}-{uuid4().hex}"
    if body.model_extra:  # as vLLM: a client's fields for other servers do not fail the request
        log.warning("%s: ignored unknown fields %s", request_id, sorted(body.model_extra))
    try:
        limits.check(max_tokens, body.stops(), top_n, max_tokens_field="max_tokens")
    except LimitExceeded as e:
        raise APIError(400, str(e), e.field) from None
    strategy = body.strategy or backend.engine.config.strategy
    if strategy not in STRATEGIES:
        raise APIError(400, f"unknown strategy {strategy!r}; choose from {sorted(STRATEGIES)}", "strategy")
    try:
        make_params(strategy, {**backend.engine.config.strategies.get(strategy, {}), **body.dlm_params})
        seed = body.seed if body.seed is not None else fresh_seed()
        sampling = SamplingParams(body.temperature, body.top_p, seed, body.top_k, top_n)
    except ValueError as e:
        raise APIError(400, str(e), "dlm_params" if body.dlm_params else None) from None
    spec = Spec(prompt, max_tokens, strategy, body.dlm_params, sampling, request_id)
    try:
        return await backend.open(spec)
    except ResourceExhausted as e:
        raise APIError(429, str(e), kind="rate_limit_error") from None
    except Unavailable as e:
        raise APIError(503, str(e), kind="unavailable_error") from None
    except ValueError as e:
        raise APIError(400, str(e)) from None


def sse(events: AsyncIterator[dict], deltas: Deltas) -> StreamingResponse:
    job = deltas.job

    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:  # the id: what the client holds once it has this event (Last-Event-ID)
                yield f"id: {job.request_id}:{deltas.chars}:{deltas.sent}\ndata: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()  # a no-op once finished; the client went away otherwise

    return StreamingResponse(body(), media_type="text/event-stream")


class Render:
    """One request's response objects: whole, or as stream chunks."""

    kind = ""

    def __init__(self, backend: Frontend, job: Job, body: GenerationRequest):
        self.backend, self.job, self.body = backend, job, body
        self.created = now()

    def token(self, token_id: int) -> str:
        return self.backend.engine.tokenizer.decode([token_id])

    def head(self, suffix: str = "") -> dict:
        return {"id": self.job.request_id, "object": self.kind + suffix, "created": self.created, "model": MODEL_ID}

    def finish(self, deltas: Deltas) -> str:
        reason = deltas.finish_reason or "error"
        return FINISH.get(reason, reason)

    def extensions(self, deltas: Deltas) -> dict:
        usage_ = usage(self.job.prompt_tokens, deltas.sent)
        return {"usage": usage_, "seed": self.job.seed, "dlm_stats": self.job.stats()}

    async def whole(self, deltas: Deltas) -> dict:
        text, ids, logprobs = "", [], []
        try:
            async for delta in deltas:
                text, ids, logprobs = text + delta.text, ids + delta.ids, logprobs + delta.logprobs
        except Unavailable as e:
            raise APIError(503, str(e), kind="unavailable_error") from None
        finally:
            self.job.cancel()
        whole = Delta(text, ids, logprobs, [], deltas.sent, len(deltas.rows))
        choice = self.choice(text, whole, self.finish(deltas))
        return {**self.head(), "choices": [choice], **self.extensions(deltas)}

    async def stream(self, deltas: Deltas) -> AsyncIterator[dict]:
        async for delta in deltas:
            if delta.text or delta.ids:
                yield {**self.head(".chunk"), "choices": [self.chunk(delta, None)]}
        last = Delta("", [], [], [], deltas.sent, len(deltas.rows))
        extensions = self.extensions(deltas)
        stream_usage = self.body.stream_options is not None and self.body.stream_options.include_usage
        yield {**self.head(".chunk"), "choices": [self.chunk(last, self.finish(deltas))], **extensions, "usage": None}
        if stream_usage:
            yield {**self.head(".chunk"), "choices": [], "usage": extensions["usage"]}

    def choice(self, text: str, delta: Delta, finish: str) -> dict:
        raise NotImplementedError

    def chunk(self, delta: Delta, finish: str | None) -> dict:
        raise NotImplementedError


class CompletionRender(Render):
    kind = "text_completion"

    def logprobs(self, ids: list[int], logprobs: list[TokenLogprob], offset: int = 0) -> dict | None:
        """The legacy completions format: parallel lists per token."""
        if self.body.logprobs is None:
            return None
        tokens = [self.token(t) for t in ids]
        offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{self.token(t): v for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }

    def choice(self, text: str, delta: Delta, finish: str) -> dict:
        logprobs = self.logprobs(delta.ids, delta.logprobs)
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def chunk(self, delta: Delta, finish: str | None) -> dict:
        return self.choice(delta.text, delta, finish) if finish is None else self.choice("", delta, finish)


class ChatRender(Render):
    kind = "chat.completion"

    def logprobs(self, ids: list[int], logprobs: list[TokenLogprob]) -> dict | None:
        if not self.body.logprobs:
            return None
        content = []
        for token_id, lp in zip(ids, logprobs, strict=True):
            top = [self.entry(t, v) for t, v in lp.top]
            content.append({**self.entry(token_id, lp.logprob), "top_logprobs": top, "dlm_verified": lp.verified})
        return {"content": content}

    def entry(self, token_id: int, logprob: float) -> dict:
        text = self.token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def choice(self, text: str, delta: Delta, finish: str) -> dict:
        message = {"role": "assistant", "content": text}
        return {
            "index": 0,
            "message": message,
            "logprobs": self.logprobs(delta.ids, delta.logprobs),
            "finish_reason": finish,
        }

    def chunk(self, delta: Delta, finish: str | None) -> dict:
        content = {"role": "assistant", "content": delta.text} if finish is None else {}
        return {
            "index": 0,
            "delta": content,
            "logprobs": self.logprobs(delta.ids, delta.logprobs),
            "finish_reason": finish,
        }
