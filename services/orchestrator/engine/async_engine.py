"""The engine over remote hosts, stepped on the event loop. A step's host calls are awaited, not run: while they
are out the loop serves clients, and a request whose deadline passes while a replica is slow ends at its deadline
(the call goes on for the others). One whose replica was lost and that finds no other by then ends with
Unavailable, which clients retry."""

import asyncio
import time
from collections.abc import Callable

from services.orchestrator.decode.round import Rounds
from services.orchestrator.engine.engine import Engine, Output
from services.orchestrator.engine.scheduler import Unavailable


class AsyncEngine(Engine):
    async def step_async(self, emit: Callable[[Output], None]) -> None:
        ended, rounds = self.begin_step()
        for out in ended:
            emit(out)
        while rounds.waiting:
            groups = rounds.groups()
            call = asyncio.ensure_future(self.models.execute(groups, rounds.parents()))
            while not call.done():
                await asyncio.wait({call}, timeout=self.next_deadline(rounds))
                self.expire(rounds, emit)
            rounds.deliver(call.result())
        for out in self.end_step(rounds):
            emit(out)

    def next_deadline(self, rounds: Rounds) -> float | None:
        """Seconds until the first deadline of a request that waits on the call, or None."""
        deadlines = [self.sequences[rid].deadline for rid in rounds.waiting if rid in self.sequences]
        deadlines = [d for d in deadlines if d is not None]
        return max(min(deadlines) - time.monotonic(), 0) if deadlines else None

    def expire(self, rounds: Rounds, emit: Callable[[Output], None]) -> None:
        now = time.monotonic()
        for rid in list(rounds.waiting):
            seq = self.sequences.get(rid)
            if seq is None or seq.deadline is None or now <= seq.deadline:
                continue
            if rid in self.models.resuming:
                why = Unavailable(f"request {rid}: its replica was lost and none took it over before its deadline")
                rounds.drop(rid, why)
                emit(self.end(seq, "error", why))
            else:
                rounds.drop(rid, TimeoutError("deadline passed while a model call was out"))
                emit(self.end(seq, "deadline"))
