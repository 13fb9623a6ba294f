"""The dlm.v1.DlmService gRPC server (grpc.aio) over a backend, with grpc.health.v1 and server reflection."""

import asyncio
import logging
import math
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import fields

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.config import Limits
from services.common.proposal import TokenLogprob
from services.common.sampling import SamplingParams, fresh_seed
from services.orchestrator.api.deltas import Deltas, RoundRow
from services.orchestrator.api.frontend import AlreadyExists, Detached, Frontend, Job, Spec
from services.orchestrator.api.relay import Relay, relayed
from services.orchestrator.engine.round_timing import RoundTiming
from services.orchestrator.engine.scheduler import ResourceExhausted, Unavailable
from services.serving.cache_index import IndexUnavailable, OwnerAlive
from services.serving.security import TokenAuth, api_key, server_credentials
from services.serving.wire import (
    FINISH,
    REQUEST_ID_HEADER,
    SERVICE,
    add_event,
    params_dict,
    params_message,
    pb,
    rpc,
    stats_message,
)

log = logging.getLogger(__name__)


def to_spec(request, limits: Limits, deadline: float | None) -> Spec:
    """Validate what the engine does not know about (server limits, the wire format); ValueError names the field."""
    kind = request.WhichOneof("input")
    prompt = request.text if kind == "text" else list(request.token_ids.ids) if kind == "token_ids" else None
    if not prompt:
        raise ValueError("prompt must not be empty (set text or token_ids)")
    max_new = request.max_new_tokens if request.HasField("max_new_tokens") else None
    if max_new is not None and max_new <= 0:
        raise ValueError(f"max_new_tokens must be > 0, got {max_new}")
    params_kind, params = params_dict(request.params)
    strategy = request.strategy or params_kind
    if params_kind is not None and params_kind != strategy:
        raise ValueError(f"params are for strategy {params_kind!r} but strategy is {strategy!r}")
    sampling = request.sampling
    if not math.isfinite(sampling.temperature):
        raise ValueError(f"temperature must be finite, got {sampling.temperature}")
    top_p = sampling.top_p if sampling.HasField("top_p") else 1.0
    seed = sampling.seed if sampling.HasField("seed") else fresh_seed()
    logprobs = request.logprobs if request.HasField("logprobs") else None
    limits.check(max_new, list(request.stop), logprobs, request.request_id)
    return Spec(
        prompt,
        max_new,
        strategy,
        params,
        SamplingParams(sampling.temperature, top_p, seed, sampling.top_k, logprobs),
        request.request_id,
        deadline,
    )


class DlmServicer(rpc.DlmServiceServicer):
    def __init__(self, backend: Frontend, limits: Limits):
        self.backend, self.limits = backend, limits
        self.relay = Relay()

    async def open(self, request, context) -> Job:
        """The request's job; its id goes out in the call's headers (a client resumes a broken call after them)."""
        job = await self.open_job(request, context)
        await context.send_initial_metadata(((REQUEST_ID_HEADER, job.request_id),))
        return job

    async def open_job(self, request, context) -> Job:
        if not self.backend.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "models are still loading")
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        try:
            spec = to_spec(request, self.limits, deadline)
            if not request.HasField("resume"):
                return await self.backend.open(spec)
            if not spec.request_id:
                raise ValueError("resume needs the request_id of the request to go on with")
            return await self.backend.resume(spec)
        except KeyError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, e.args[0])
        except OwnerAlive as e:  # decoding on a live orchestrator: relayed from it (relay.py), or try again
            if e.address and not relayed(context):
                raise
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except IndexUnavailable as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except AlreadyExists as e:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        except ResourceExhausted as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except Unavailable as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def token_logprob(self, token_id: int, lp: TokenLogprob):
        """A token's logprob message, with the texts of the token and its alternatives (clients hold no tokenizer)."""
        text = self.backend.engine.tokenizer.decode
        top = [pb.TopLogprob(token_id=t, logprob=v, token=text([t])) for t, v in lp.top]
        token = text([token_id])
        return pb.TokenLogprob(token_id=token_id, logprob=lp.logprob, top=top, verified=lp.verified, token=token)

    async def run(self, job: Job, request, context) -> AsyncIterator:
        """A job's rounds as stream messages: Chunk / Spans per round, then Complete; the last Chunk inside the
        Complete where the request set last_chunk_in_complete. Each message a stream sends waits for the one before
        to be written, which took 1.2-2.5 ms at the end of a served c=1 request on the 2-core box."""
        deltas = Deltas(job, self.backend.detokenizer(), list(request.stop), frozenset(request.stop_token_ids))
        deltas.held_ids, deltas.held_chars = request.resume.tokens_received, request.resume.text_received
        last = None
        try:
            async for delta in deltas:
                if delta.text or delta.ids:
                    pairs = zip(delta.ids, delta.logprobs, strict=True) if delta.logprobs else ()
                    logprobs = [self.token_logprob(t, lp) for t, lp in pairs]
                    message = chunk(delta.text, delta.ids, delta.sent, delta.rounds, logprobs)
                    if delta.last and not delta.spans and request.last_chunk_in_complete:
                        last = message.chunk
                    else:
                        yield message
                if delta.spans:
                    spans = [pb.Span(offset=offset, token_ids=ids) for offset, ids in delta.spans]
                    yield pb.GenerateStreamResponse(spans=pb.Spans(spans=spans))
        except Unavailable as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except Detached as e:  # not UNAVAILABLE: a client that resumed in its turn would take the request back
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        except Exception as e:
            log.exception("request %s failed", job.request_id)
            await context.abort(grpc.StatusCode.INTERNAL, f"decoding failed: {e}")
        reason = deltas.finish_reason
        if reason == "deadline":
            if last is not None:
                yield pb.GenerateStreamResponse(chunk=last)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded while decoding")
        trace = [round_trace(row) for row in deltas.rows] if request.trace else []
        complete = pb.Complete(
            finish_reason=FINISH.get(reason, pb.FINISH_REASON_UNSPECIFIED),
            usage=pb.Usage(prompt_tokens=job.prompt_tokens, completion_tokens=deltas.sent),
            stats=stats_message(job.stats()),
            trace=trace,
            request_id=job.request_id,
            seed=job.seed,
            last_chunk=last,
        )
        yield pb.GenerateStreamResponse(complete=complete)

    async def GenerateStream(self, request, context):
        try:
            job = await self.open(request, context)
        except OwnerAlive as owner:
            async for message in self.relay.stream(owner.address, request, context):
                yield message
            return
        try:
            async for message in self.run(job, request, context):
                yield message
        finally:
            job.cancel()  # a no-op once finished; stops decoding when the client cancelled or the deadline passed

    async def Generate(self, request, context):
        if request.HasField("resume"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "resume: a stream resumes, use GenerateStream")
        job = await self.open(request, context)
        out = pb.GenerateResponse(request_id=job.request_id)
        try:
            async for message in self.run(job, request, context):
                add_event(out, getattr(message, message.WhichOneof("event")))
        finally:
            job.cancel()
        return out

    async def Abort(self, request, context):
        return pb.AbortResponse(found=self.backend.abort(request.request_id))

    async def ListStrategies(self, request, context):
        infos = [
            pb.StrategyInfo(name=name, defaults=params_message(name, values))
            for name, values in self.backend.strategies().items()
        ]
        return pb.ListStrategiesResponse(strategies=infos, default_strategy=self.backend.model_info().default_strategy)

    async def ModelInfo(self, request, context):
        info, limits = self.backend.model_info(), self.limits
        return pb.ModelInfoResponse(
            models=[pb.ModelRole(role=role, path=path) for role, path in info.models.items()],
            vocab_size=info.vocab_size,
            max_context=info.max_context,
            device=info.device,
            dtype=info.dtype,
            ready=self.backend.ready,
            default_strategy=info.default_strategy,
            default_max_new_tokens=info.default_max_new_tokens,
            limits=pb.Limits(
                max_new_tokens=limits.max_new_tokens,
                max_stop_sequences=limits.max_stop_sequences,
                max_stop_length=limits.max_stop_length,
                max_logprobs=limits.max_logprobs,
            ),
        )


TIMING_FIELDS = tuple(f.name for f in fields(RoundTiming))


def round_trace(row: RoundRow):
    """A round's row, with its step's timing where it had one (the message's fields are RoundTiming's). Not
    dataclasses.asdict, whose deep copy of the dicts took 0.26 ms of a 6-round request's last message, 0.07 without."""
    timing = {name: getattr(row.timing, name) for name in TIMING_FIELDS} if row.timing is not None else {}
    return pb.RoundTrace(
        round=row.round, prefix_tokens=row.prefix_tokens, span_tokens=row.span_tokens, elapsed_s=row.elapsed_s, **timing
    )


def chunk(text: str, ids: list[int], sent: int, rounds: int, logprobs: list):
    message = pb.Chunk(text=text, token_ids=ids, completion_tokens=sent, rounds=rounds, logprobs=logprobs)
    return pb.GenerateStreamResponse(chunk=message)


class Server:
    """DlmService + health + reflection on one port; models load in the background, health says when done.
    TLS and the bearer token come from the config's serving section (serving.tls_*_file, api_key_file or
    DLM_API_KEY)."""

    def __init__(self, backend: Frontend, limits: Limits | None = None):
        serving = backend.engine.config.serving
        self.backend, self.limits, self.serving = backend, limits or serving.limits, serving
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.loading: asyncio.Task | None = None
        self.port = 0
        self.socket: str | None = None

    async def start(self, address: str = "127.0.0.1:0", shared: bool = False) -> int:
        """Listen on address and start loading the models; returns the bound port. shared: other servers (the
        orchestrator's other replicas on this host) listen on the same port, and the kernel spreads connections
        over them (SO_REUSEPORT); the replica's own health probe then goes through a Unix socket of its own."""
        token = api_key(self.serving.api_key_file)
        interceptors = [TokenAuth(token)] if token else []
        options = [("grpc.so_reuseport", int(shared))]
        self.server = grpc.aio.server(interceptors=interceptors, options=options)
        self.servicer = DlmServicer(self.backend, self.limits)
        rpc.add_DlmServiceServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        credentials = server_credentials(self.serving)
        if credentials is None:
            self.port = self.server.add_insecure_port(address)
            self.listen_private(address.rsplit(":", 1)[0])
        else:
            self.port = self.server.add_secure_port(address, credentials)
        if credentials is not None or shared:
            # a plaintext Unix socket only this host's processes reach, for the replica's own health probe
            self.socket = os.path.join(tempfile.mkdtemp(prefix="dlm-grpc-"), "grpc.sock")
            self.server.add_insecure_port(f"unix:{self.socket}")
        await self.set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        self.loading = asyncio.create_task(self.load())
        return self.port

    def listen_private(self, host: str) -> None:
        """A port of this server alone, where other orchestrators relay the streams of its requests from (relay.py);
        recorded with its lease. Several orchestrators may share the public port."""
        if self.backend.records is None:
            return
        port = self.server.add_insecure_port(f"{host}:0")
        reachable = socket.gethostbyname(socket.gethostname()) if host in ("0.0.0.0", "::", "[::]") else host
        self.backend.records.address = f"{reachable}:{port}"

    def local_target(self, host: str) -> str:
        """Where a plaintext channel on this host reaches this server (its health probe): the port, or under TLS or
        on a shared port the Unix socket."""
        local = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
        return f"unix:{self.socket}" if self.socket else f"{local}:{self.port}"

    async def set_health(self, status) -> None:
        for name in ("", SERVICE):
            await self.health.set(name, status)

    async def load(self) -> None:
        try:
            await self.backend.start()
        except Exception:
            log.exception("loading the models failed; health stays NOT_SERVING")
            raise
        await self.set_health(health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 2.0) -> None:
        """Refuse new requests, finish live ones as CANCELLED, then close the port."""
        await self.health.enter_graceful_shutdown()
        if self.loading and not self.loading.done():
            self.loading.cancel()
        self.backend.ready = False
        await self.backend.shutdown()
        await self.server.stop(grace)
        await self.servicer.relay.close()
        if self.socket:
            shutil.rmtree(os.path.dirname(self.socket), ignore_errors=True)


async def serve(backend: Frontend, address: str, limits: Limits | None = None) -> None:
    """Run until SIGINT / SIGTERM; fails if a model does not load."""
    server = Server(backend, limits)
    port = await server.start(address)
    log.info("dlm.v1.DlmService listening on port %d, loading models", port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    waiter = asyncio.create_task(stopping.wait())
    try:
        await asyncio.wait([server.loading, waiter], return_when=asyncio.FIRST_COMPLETED)
        if server.loading.done() and not server.loading.cancelled():
            server.loading.result()  # raises what failed to load
            log.info("models loaded: SERVING")
            await waiter
    finally:
        waiter.cancel()
        await server.stop()
