"""The live rounds of one step, driven together. `Rounds` gathers what every waiting round asks next, groups the
calls by (role, method) so that each group is one batched host call, and hands each round its values back. A step
takes as many of these phases as its longest round has stages that call a model (two for guided, pipeline and slot;
one for the others)."""

from typing import Any

from services.common.contract import ROLES, Call, Groups, Key, Parents, Reply, Results, Stage
from services.common.proposal import Committed
from services.common.request import Request


def account(req: Request, call: Call, reply: Reply) -> Any:
    """The engine counts each request's forwards and processed tokens; a host that sampled says how many draws the
    request's RNG has made (a remote host drew from its copy)."""
    counter = ROLES[call.role].counter
    setattr(req.stats, counter, getattr(req.stats, counter) + reply.forwards)
    req.stats.model_forwards += reply.forwards
    req.stats.drafter_tokens_processed += reply.tokens
    if reply.draws is not None:
        req.rng.draws = reply.draws
    return reply.value


class Rounds:
    def __init__(self, rounds: dict[str, tuple[Request, Stage[Committed]]], traces: dict[str, str] | None = None):
        self.rounds = rounds
        self.traces = traces  # request id -> its round span's traceparent (engine/telemetry.py)
        self.waiting: dict[str, list[Call]] = {}  # request id -> the calls its round waits on
        self.layout: dict[Key, list[tuple[str, int]]] = {}  # per group, (request id, index in its calls) per arg
        self.done: dict[str, Committed | BaseException] = {}
        for rid in rounds:
            self.advance(rid, None)

    def advance(self, rid: str, values: list | None) -> None:
        self.waiting.pop(rid, None)
        try:
            self.waiting[rid] = self.rounds[rid][1].send(values)
        except StopIteration as stop:
            self.done[rid] = stop.value
        except Exception as e:  # this request's round failed; the others go on
            self.done[rid] = e

    def groups(self) -> Groups:
        self.layout = {}
        for rid, calls in self.waiting.items():
            for j, call in enumerate(calls):
                self.layout.setdefault((call.role, call.method), []).append((rid, j))
        return {key: [self.waiting[rid][j].args for rid, j in entries] for key, entries in self.layout.items()}

    def parents(self) -> Parents:
        """After groups(): each call's round traceparent, in the groups' order."""
        if self.traces is None:
            return None
        return {key: [self.traces.get(rid, "") for rid, _ in entries] for key, entries in self.layout.items()}

    def deliver(self, results: Results) -> None:
        """Hand each waiting round its values; a round whose group failed ends with that error."""
        values = {rid: [None] * len(calls) for rid, calls in self.waiting.items()}
        errors: dict[str, BaseException] = {}
        for key, entries in self.layout.items():
            replies = results[key]
            for i, (rid, j) in enumerate(entries):
                if rid not in values:
                    continue  # dropped while the call was out
                if isinstance(replies, BaseException):
                    errors[rid] = replies
                else:
                    values[rid][j] = account(self.rounds[rid][0], self.waiting[rid][j], replies[i])
        for rid in list(self.waiting):
            if rid in errors:
                self.drop(rid, errors[rid])
            else:
                self.advance(rid, values[rid])

    def drop(self, rid: str, why: BaseException) -> None:
        """End a round early (its deadline passed, or its host call failed)."""
        self.waiting.pop(rid, None)
        self.rounds[rid][1].close()
        self.done[rid] = why
