"""The engine: a scheduler and its step. A step is schedule -> a printable plan -> execute every running request's
round, one batched host call per stage (rounds.py) -> update. A request alone is a batch of one. The library, the
CLI, the benchmarks and both servers decode through it; its `Executor` runs the hosts in process
(local_executor.py) or as Ray Serve deployments (services/orchestrator/cluster/remote_executor.py)."""

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from services.common.config import EngineConfig
from services.common.contract import Executor
from services.common.proposal import Committed
from services.common.request import Request
from services.common.sampling import SamplingParams
from services.orchestrator.decode.round import one_round
from services.orchestrator.decode.strategies import make_params
from services.orchestrator.engine.local_executor import LocalExecutor
from services.orchestrator.engine.output import RequestOutput
from services.orchestrator.engine.round_timing import RoundTiming, StepClock
from services.orchestrator.engine.rounds import Rounds
from services.orchestrator.engine.scheduler import Admission, EngineRequest, LedgerAdmission, Scheduler, Unavailable
from services.orchestrator.engine.telemetry import Telemetry

Prompt = str | list[int]
Emit = Callable[[RequestOutput], None]


class AlreadyExists(Exception):
    pass


@dataclass(slots=True)
class StepPlan:
    """What a step runs, decided before any model is called (vLLM's SchedulerOutput)."""

    ending: dict[str, str]  # request id -> why it ends before its round (cancelled, stop, deadline)
    running: dict[str, str]  # request id -> its strategy: each advances one round
    waiting: int  # requests left waiting for KV room

    def __str__(self) -> str:
        running = ", ".join(f"{rid}:{strategy}" for rid, strategy in self.running.items()) or "-"
        ending = ", ".join(f"{rid}:{why}" for rid, why in self.ending.items())
        return f"step: run [{running}]" + (f" end [{ending}]" if ending else "") + f" waiting {self.waiting}"


@dataclass(slots=True)
class Result:
    """A finished request, as the library's generate() returns it."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: dict


def seconds_to_first(deadlines: Iterable[float | None]) -> float | None:
    """Seconds until the earliest of these time.monotonic() deadlines (None: no deadline), or None if none is set."""
    given = [d for d in deadlines if d is not None]
    return max(min(given) - time.monotonic(), 0) if given else None


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        executor: Executor | None = None,
        admission: Admission | None = None,
        telemetry: Telemetry | None = None,
    ):
        self.config = config
        self.executor = executor or LocalExecutor(config)
        serving = config.serving
        admission = admission or LedgerAdmission(self.executor.placement)
        self.scheduler = Scheduler(admission, serving.max_concurrency, serving.max_queue)
        self.requests: dict[str, EngineRequest] = {}
        self.releases: dict[str, list[str]] = {}  # host -> ended requests whose KV it still holds
        self.ids = itertools.count()
        self.loop: asyncio.AbstractEventLoop | None = None  # step()'s own loop, for callers without one
        self.telemetry = telemetry or Telemetry(config)

    @property
    def tokenizer(self):
        return self.executor.meta().tokenizer

    def encode(self, prompt: str) -> list[int]:
        if self.config.chat_template:
            return self.encode_chat([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """A conversation in the tokenizer's chat template, ready for the assistant's turn; without a template, the
        contents one per line."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n".join(m["content"] for m in messages)
        return tok.encode(text, add_special_tokens=False)

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def request(
        self,
        prompt: Prompt,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> Request:
        """Encode and check a prompt: ValueError names what is wrong."""
        base = self.executor.meta()
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("prompt must not be empty")
        vocab = len(base.tokenizer)
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        max_new = max_new_tokens if max_new_tokens is not None else self.config.max_new_tokens
        if len(ids) >= base.max_length:
            raise ValueError(f"prompt has {len(ids)} tokens, over the model context of {base.max_length}")
        if max_new <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {max_new}")
        if len(ids) + max_new > base.max_length:
            raise ValueError(
                f"max_new_tokens {max_new} + prompt {len(ids)} exceeds the model context {base.max_length}"
            )
        mask_id = base.mask_id if base.mask_id is not None else -1
        rid = request_id or f"req-{next(self.ids)}"
        return Request(rid, ids, max_new, mask_id, base.eos_id, sampling or SamplingParams())

    def add(
        self, req: Request, strategy: str | None = None, params: dict | None = None, deadline: float | None = None
    ) -> EngineRequest:
        """Queue a request with its strategy; ValueError names a bad parameter, ResourceExhausted a full queue."""
        name = strategy or self.config.strategy
        overrides = {**self.config.strategies.get(name, {}), **(params or {})}
        stages = make_params(name, overrides).build(self.executor)
        if req.id in self.requests:
            raise AlreadyExists(f"request_id {req.id!r} is already decoding")
        er = EngineRequest(req, stages, name, overrides, deadline)
        self.scheduler.add(er)
        self.requests[req.id] = er
        self.telemetry.added(er)
        return er

    def add_request(
        self,
        prompt: Prompt,
        strategy: str | None = None,
        params: dict | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> Request:
        req = self.request(prompt, max_new_tokens, sampling, request_id)
        self.add(req, strategy, params)
        return req

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """The request ends with `reason` at the start of the next step."""
        er = self.requests.get(request_id)
        if er is not None and er.stop_reason is None:
            er.stop_reason = reason

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def schedule(self, emit: Emit) -> StepPlan:
        """End what was aborted or expired or that the ledger refused, then admit from the queue while it has room."""
        now = time.monotonic()
        ending = {
            rid: er.stop_reason or "deadline"
            for rid, er in self.requests.items()
            if er.stop_reason or (er.deadline is not None and now > er.deadline)
        }
        for rid, why in ending.items():
            emit(self.end(self.requests[rid], why))
        for er, error in self.scheduler.refused():
            emit(self.end(er, "error", error))
        running = self.scheduler.schedule()
        self.telemetry.queue(len(running), len(self.scheduler.waiting))
        return StepPlan(ending, {er.req.id: er.strategy for er in running}, len(self.scheduler.waiting))

    async def step_async(self, emit: Emit) -> StepPlan:
        """One step; each request's output is emitted as soon as it is known (one whose deadline passes while a
        model call is out ends then, and the call goes on for the others)."""
        clock = StepClock()
        plan = self.schedule(emit)
        running = [self.requests[rid] for rid in plan.running]
        rounds = Rounds(
            {er.req.id: (er.req, one_round(er.req, er.stages)) for er in running}, self.telemetry.round_begins(running)
        )
        while rounds.waiting:
            groups, parents = rounds.groups(), rounds.parents()
            sent = time.time()
            call = asyncio.ensure_future(self.executor.execute(groups, parents))  # already sent
            while not call.done():
                await asyncio.wait({call}, timeout=self.next_deadline(rounds))
                self.expire(rounds, emit)
            clock.phase(sent, time.time(), call.result())
            rounds.deliver(call.result())
        await self.update(rounds, emit, clock.finish(len(rounds.done)))
        return plan

    def step(self) -> list[RequestOutput]:
        """step_async for callers without an event loop (the library, the CLI, benchmarks, tests)."""
        outputs: list[RequestOutput] = []
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.step_async(outputs.append))
        return outputs

    def next_deadline(self, rounds: Rounds) -> float | None:
        """Seconds until the first deadline of a request that waits on the call, or None."""
        return seconds_to_first(self.requests[rid].deadline for rid in rounds.waiting if rid in self.requests)

    def expire(self, rounds: Rounds, emit: Emit) -> None:
        now = time.monotonic()
        for rid in list(rounds.waiting):
            er = self.requests.get(rid)
            if er is None or er.deadline is None or now <= er.deadline:
                continue
            if rid in self.executor.resuming:
                why = Unavailable(f"request {rid}: its replica was lost and none took it over before its deadline")
                rounds.drop(rid, why)
                emit(self.end(er, "error", why))
            else:
                rounds.drop(rid, TimeoutError("deadline passed while a model call was out"))
                emit(self.end(er, "deadline"))

    async def update(self, rounds: Rounds, emit: Emit, timing: RoundTiming) -> None:
        """Every round's output, and every request that finished out of the engine with its KV released; then one
        turn of the event loop, in which the streams take their outputs and start their writes, before the
        bookkeeping (round metrics and spans, each record's progress, a finished request's log line and metrics),
        which runs while those writes are out. Served c=1 on the 2-core box, a chunk left its stream 0.30-0.34 ms
        after its round, against 1.1-1.7 ms with the bookkeeping first (of it, 0.57 ms a finished request's
        telemetry)."""
        emitted = []
        for rid, result in rounds.done.items():
            er = self.requests.get(rid)
            if er is None:
                continue  # ended while its round was out (a deadline)
            if isinstance(result, BaseException):
                self.telemetry.round_ends(er, result, timing)
                emit(self.end(er, "error", result))
                continue
            emit(RequestOutput.of(er.req, result, timing))
            if er.req.finished:
                self.take_out(er)  # its record leaves the index with it: no last commit to write first
            emitted.append((er, result))
        self.flush_releases()
        try:
            await asyncio.sleep(0)
        finally:  # also when the driver is cancelled in that turn (Frontend.shutdown): what it emitted is settled
            self.settle(emitted, timing)

    def settle(self, emitted: list[tuple[EngineRequest, Committed]], timing: RoundTiming) -> None:
        for er, result in emitted:
            self.telemetry.round_ends(er, result, timing)
            if er.req.finished:
                self.telemetry.finished(er)
            else:
                self.scheduler.admission.progress(er)
        self.telemetry.queue(len(self.scheduler.running), len(self.scheduler.waiting))

    def end(self, er: EngineRequest, reason: str | None = None, error: BaseException | None = None) -> RequestOutput:
        """take_out, then the request's telemetry; -> its last output."""
        self.take_out(er, reason)
        self.telemetry.finished(er, error)
        return RequestOutput.ended(er.req, error)

    def take_out(self, er: EngineRequest, reason: str | None = None) -> None:
        """Take a request out: its budget, and (at the step's end) its KV on every host that holds it."""
        req = er.req
        self.scheduler.finish(er)
        del self.requests[req.id]
        for host in er.stages.roles:
            self.releases.setdefault(host, []).append(req.id)
        if reason is not None:
            req.finish_reason = reason
        req.stats.finish()

    def flush_releases(self) -> None:
        releases, self.releases = self.releases, {}
        for host, ids in releases.items():
            self.executor.release(host, ids)
        for rid in {rid for ids in releases.values() for rid in ids}:
            self.scheduler.admission.placement.drop(rid)

    def stream(self, req: Request, strategy: str | None = None, params: dict | None = None) -> Iterator[RequestOutput]:
        """Queue one request (ValueError now, for a bad strategy or parameter) and decode it to its end."""
        self.add(req, strategy, params)
        return self.outputs(req)

    def outputs(self, req: Request) -> Iterator[RequestOutput]:
        """Step until the request ends, yielding its outputs round by round. Requests added before it advance too;
        their outputs are not kept: a caller with several requests uses step()."""
        try:
            while req.id in self.requests:
                for out in self.step():
                    if out.request_id == req.id:
                        if out.error is not None:
                            raise out.error
                        yield out
        finally:
            self.cancel([req])

    def cancel(self, reqs: list[Request]) -> None:
        """End these requests now if they still run (the caller stopped listening)."""
        for req in reqs:
            if req.id in self.requests:
                self.end(self.requests[req.id], "cancelled")
        self.flush_releases()

    def generate(
        self,
        prompt: Prompt | list[Prompt],
        strategy: str | None = None,
        params: dict | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        on_output: Emit | None = None,
    ) -> Result | list[Result]:
        """Decode one prompt, or a list of prompts batched together (each with its own RNG seeded from sampling)."""
        many = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
        reqs = [self.request(p, max_new_tokens, sampling) for p in (prompt if many else [prompt])]
        for req in reqs:
            self.add(req, strategy, params)
        ids = {req.id for req in reqs}
        try:
            while any(req.id in self.requests for req in reqs):
                for out in self.step():
                    if out.error is not None and out.request_id in ids:
                        raise out.error
                    if on_output and out.request_id in ids:
                        on_output(out)
        finally:
            self.cancel(reqs)
        outputs = [r.output_ids() for r in reqs]
        results = [
            Result(self.decode_text(ids), ids, r.finish_reason, r.stats.to_dict())
            for r, ids in zip(reqs, outputs, strict=True)
        ]
        return results if many else results[0]
