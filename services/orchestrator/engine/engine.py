"""The engine: a scheduler and its step. `step()` advances every running request one round, with one batched host
call per stage (services/orchestrator/decode/round.py); a request alone is a batch of one. The library, the CLI, the
benchmarks and the gRPC server all decode through it; served, the hosts are Ray Serve deployments
(services/orchestrator/engine/async_engine.py)."""

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from services.common.config import EngineConfig
from services.common.proposal import Committed
from services.common.request import Request
from services.common.sampling import SamplingParams
from services.orchestrator.decode.round import Rounds, one_round, run
from services.orchestrator.decode.strategies import make_params
from services.orchestrator.engine.local_executor import ModelPool
from services.orchestrator.engine.scheduler import Admission, Scheduler, Sequence, TokenAdmission
from services.orchestrator.engine.telemetry import Telemetry

Prompt = str | list[int]


class AlreadyExists(Exception):
    pass


@dataclass(slots=True)
class Output:
    """What one step did for one request: its round's commits, or how it ended without one."""

    request_id: str
    event: Committed
    error: BaseException | None = None


@dataclass(slots=True)
class Result:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: dict


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        models=None,
        admission: Admission | None = None,
        telemetry: Telemetry | None = None,
    ):
        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        self.models = models or ModelPool(config)  # or the Serve deployments (RemoteHosts)
        serving = config.serving
        admission = admission or TokenAdmission(serving.kv_budget_tokens)
        self.scheduler = Scheduler(admission, serving.max_concurrency, serving.max_queue)
        self.sequences: dict[str, Sequence] = {}
        self.releases: dict[str, list[str]] = {}  # role -> ended requests whose KV it still holds
        self.ids = itertools.count()
        self.worker: ThreadPoolExecutor | None = None  # step_async's thread: the event loop stays free
        self.telemetry = telemetry or Telemetry(config)

    @property
    def tokenizer(self):
        return self.models.meta().tokenizer

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
        base = self.models.meta()
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

    def add(self, req: Request, strategy: str | None = None, params: dict | None = None, deadline=None) -> Sequence:
        """Queue a request with its strategy; ValueError names a bad parameter, ResourceExhausted a full queue."""
        name = strategy or self.config.strategy
        overrides = {**self.config.strategies.get(name, {}), **(params or {})}
        stages = make_params(name, overrides).build(self.models)
        if req.id in self.sequences:
            raise AlreadyExists(f"request_id {req.id!r} is already decoding")
        seq = Sequence(req, stages, name, overrides, deadline)
        self.scheduler.add(seq)
        self.sequences[req.id] = seq
        self.telemetry.added(seq)
        return seq

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
        """Any thread: the request ends with `reason` at the start of the next step."""
        seq = self.sequences.get(request_id)
        if seq is not None and seq.stop_reason is None:
            seq.stop_reason = reason

    def has_unfinished(self) -> bool:
        return bool(self.sequences)

    def step(self) -> list[Output]:
        ended, rounds = self.begin_step()
        run(rounds, self.models.execute)
        return ended + self.end_step(rounds)

    async def step_async(self, emit: Callable[[Output], None]) -> None:
        """One step on a worker thread, so that the event loop serving clients never waits on a forward."""
        if self.worker is None:
            self.worker = ThreadPoolExecutor(1, thread_name_prefix="dlm-step")
        for out in await asyncio.get_running_loop().run_in_executor(self.worker, self.step):
            emit(out)

    def begin_step(self) -> tuple[list[Output], Rounds]:
        now = time.monotonic()
        ended = [
            self.end(seq, seq.stop_reason or "deadline")
            for seq in list(self.sequences.values())
            if seq.stop_reason or (seq.deadline is not None and now > seq.deadline)
        ]
        running = self.scheduler.schedule()
        self.telemetry.queue(len(self.scheduler.running), len(self.scheduler.waiting))
        traces = self.telemetry.round_begins(running)
        return ended, Rounds({seq.req.id: (seq.req, one_round(seq.req, seq.stages)) for seq in running}, traces)

    def end_step(self, rounds: Rounds) -> list[Output]:
        outputs = []
        for rid, result in rounds.done.items():
            seq = self.sequences.get(rid)
            if seq is None:
                continue  # ended while its round was out (a deadline)
            self.telemetry.round_ends(seq, result)
            if isinstance(result, BaseException):
                outputs.append(self.end(seq, "error", result))
                continue
            self.scheduler.admission.progress(seq)
            outputs.append(Output(rid, result))
            if seq.req.finished:
                self.end(seq)
        self.flush_releases()
        self.telemetry.queue(len(self.scheduler.running), len(self.scheduler.waiting))
        return outputs

    def end(self, seq: Sequence, reason: str | None = None, error: BaseException | None = None) -> Output:
        """Take a request out: its budget, and (at the step's end) its KV on every host that holds it."""
        req = seq.req
        self.scheduler.finish(seq)
        del self.sequences[req.id]
        for role in seq.stages.roles:
            self.releases.setdefault(role, []).append(req.id)
        if reason is not None:
            req.finish_reason = reason
        req.stats.finish()
        self.telemetry.finished(seq, error)
        return Output(req.id, Committed([], [], req.finish_reason), error)

    def flush_releases(self) -> None:
        releases, self.releases = self.releases, {}
        for role, ids in releases.items():
            self.models.release(role, ids)

    def stream(self, req: Request, strategy: str | None = None, params: dict | None = None) -> Iterator[Committed]:
        """Queue one request (ValueError now, for a bad strategy or parameter) and decode it to its end."""
        self.add(req, strategy, params)
        return self.events(req)

    def events(self, req: Request) -> Iterator[Committed]:
        """Step until the request ends, yielding its commits round by round. Requests added before it advance too;
        their outputs are not kept: a caller with several requests uses step()."""
        try:
            while req.id in self.sequences:
                for out in self.step():
                    if out.request_id == req.id:
                        if out.error is not None:
                            raise out.error
                        yield out.event
        finally:
            self.cancel([req])

    def cancel(self, reqs: list[Request]) -> None:
        """End these requests now if they still run (the caller stopped listening)."""
        for req in reqs:
            if req.id in self.sequences:
                self.end(self.sequences[req.id], "cancelled")
        self.flush_releases()

    def generate(
        self,
        prompt: Prompt | list[Prompt],
        strategy: str | None = None,
        params: dict | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        on_commit: Callable[[Committed], None] | None = None,
    ) -> Result | list[Result]:
        """Decode one prompt, or a list of prompts batched together (each with its own RNG seeded from sampling)."""
        many = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
        reqs = [self.request(p, max_new_tokens, sampling) for p in (prompt if many else [prompt])]
        for req in reqs:
            self.add(req, strategy, params)
        ids = {req.id for req in reqs}
        try:
            while any(req.id in self.sequences for req in reqs):
                for out in self.step():
                    if out.error is not None and out.request_id in ids:
                        raise out.error
                    if on_commit and out.request_id in ids:
                        on_commit(out.event)
        finally:
            self.cancel(reqs)
        outputs = [r.output_ids() for r in reqs]
        results = [
            Result(self.decode_text(ids), ids, r.finish_reason, r.stats.to_dict())
            for r, ids in zip(reqs, outputs, strict=True)
        ]
        return results if many else results[0]
