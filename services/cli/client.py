"""A thin synchronous client of dlm.v1.DlmService (needs no torch): generate, stream, strategies, model info, health."""

import time
from collections.abc import Iterator, Sequence
from typing import Any
from uuid import uuid4

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.cli.reconnect import holds, resuming
from services.serving.security import bearer, channel
from services.serving.wire import SERVICE, add_event, params_message, pb, rpc


class DlmClient:
    def __init__(
        self,
        target: str,
        timeout: float | None = None,
        api_key: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        resume_timeout: float = 60.0,
    ):
        """api_key: the server's bearer token; tls_ca: the CA file that signed the server's certificate (TLS);
        tls_cert + tls_key: this client's certificate where the server asks for one (mTLS); resume_timeout: how long
        `stream` and `generate` go on reconnecting after a broken stream (services/cli/reconnect.py), 0: never."""
        self.target = target
        self.channel = channel(target, tls_ca, tls_cert, tls_key)
        self.metadata = bearer(api_key)
        self.stub = rpc.DlmServiceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.timeout = timeout  # per call, seconds; None: no deadline
        self.resume_timeout = resume_timeout

    def __enter__(self) -> "DlmClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def call(self, method, request):
        """One DlmService call with this client's deadline and token."""
        return method(request, timeout=self.timeout, metadata=self.metadata)

    @staticmethod
    def request(
        prompt: str | Sequence[int],
        *,
        strategy: str | None = None,
        params: dict[str, Any] | None = None,
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        top_k: int = 0,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        logprobs: int | None = None,
        trace: bool = False,
        request_id: str = "",
    ):
        """A GenerateRequest; params values may be strings (KEY=VALUE from a command line). seed None: the server
        picks one and returns it; logprobs N: each token's logprob and its N most likely alternatives."""
        req = pb.GenerateRequest(
            request_id=request_id,
            strategy=strategy or "",
            sampling=pb.SamplingParams(temperature=temperature, top_p=top_p, seed=seed, top_k=top_k),
            stop=list(stop),
            stop_token_ids=list(stop_token_ids),
            logprobs=logprobs,
            trace=trace,
        )
        if isinstance(prompt, str):
            req.text = prompt
        else:
            req.token_ids.ids.extend(prompt)
        if max_new_tokens is not None:
            req.max_new_tokens = max_new_tokens
        if params:
            if not strategy:
                raise ValueError("strategy parameters need a strategy")
            req.params.CopyFrom(params_message(strategy, params))
        return req

    def generate(self, prompt: str | Sequence[int], **kwargs):
        """Decode to completion -> GenerateResponse (text, token_ids, finish_reason, usage, stats). A call that
        breaks (UNAVAILABLE) once the server held its request resumes it as a stream, collected into the response."""
        request = self.prepared(self.request(prompt, **kwargs))
        try:
            return self.call(self.stub.Generate, request)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or not self.resume_timeout or not holds(e):
                raise
        out = pb.GenerateResponse(request_id=request.request_id)
        for event in resuming(self.open_stream, request, self.resume_timeout, held=True):
            add_event(out, event)
        return out

    def stream(self, prompt: str | Sequence[int], **kwargs) -> Iterator:
        """Yield pb.Chunk, pb.Spans and finally one pb.Complete, across reconnects when the stream breaks;
        closing the iterator cancels the request."""
        request = self.prepared(self.request(prompt, **kwargs))
        yield from resuming(self.open_stream, request, self.resume_timeout)

    def open_stream(self, request):
        return self.call(self.stub.GenerateStream, request)

    @staticmethod
    def prepared(request):
        """The request with a request id (a uuid unless it names one), so that it can resume even if its stream
        breaks before the first message; and asking for its last Chunk inside its Complete, which `resuming` yields
        as a Chunk of its own."""
        request.request_id = request.request_id or uuid4().hex
        request.last_chunk_in_complete = True
        return request

    def abort(self, request_id: str) -> bool:
        """End a live request (its stream completes as cancelled); False when it was not live."""
        return self.call(self.stub.Abort, pb.AbortRequest(request_id=request_id)).found

    def strategies(self) -> dict[str, dict[str, Any]]:
        """name -> the parameters the server uses when a request sets none."""
        out = {}
        for info in self.call(self.stub.ListStrategies, pb.ListStrategiesRequest()).strategies:
            values = getattr(info.defaults, info.defaults.WhichOneof("kind"))
            out[info.name] = {f.name: v for f, v in values.ListFields()}
        return out

    def model_info(self):
        return self.call(self.stub.ModelInfo, pb.ModelInfoRequest())

    def health(self, service: str = SERVICE) -> str:
        """SERVING, NOT_SERVING, ... for the service ("" for the whole server)."""
        reply = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.05) -> None:
        """Block until the server reports SERVING (its models are loaded)."""
        end = time.monotonic() + timeout
        while True:
            try:
                if self.health() == "SERVING":
                    return
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
            if time.monotonic() > end:
                raise TimeoutError(f"server not SERVING after {timeout} s")
            time.sleep(interval)
