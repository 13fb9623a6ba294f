"""What every model deployment adds to its host on a replica: `direct`, the one entry point of the orchestrator's
batched calls (services/common/contract.py), which records a stage span per call (a child of the call's round, tagged
with this replica) and reports the replica's KV usage to Ray's metrics after each call.

The orchestrator sends a call straight to the replica's own actor, as a closure run on it (`actor.__ray_call__`,
services/serving/direct.py), rather than through Serve's handle: 1.5 ms a no-op round trip against 4.0
(scripts/transport_rtt.py). Serve still places, scales, restarts and health-checks the replica; `actor` hands the
orchestrator the replica's actor through a Serve call."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import ray
from ray import serve
from ray.actor import ActorHandle
from ray.serve.metrics import Gauge

import services.serving.pickling  # noqa: F401  the contract's classes cross the hop compactly
from services.common.compute import timed_call
from services.common.contract import Args, Reply
from services.common.kv_manager import KVManager
from services.common.tracing import stage_spans

HOST: "ReplicaHost | None" = None  # this replica process's host, where `direct` finds it


class ReplicaHost:
    kv: KVManager | None = None  # the host's KV manager, where it keeps per-request caches

    def start_replica(self, kv_budget_tokens: int) -> None:
        context = serve.get_replica_context()
        self.deployment, self.replica = context.deployment, context.replica_id.unique_id
        self.kv_budget = kv_budget_tokens
        self.kv_usage = Gauge("dlm_kv_cache_usage_perc", description="Fraction of the replica's KV budget cached")
        # The host's calls and releases run one at a time on a thread of their own, as in process
        # (engine/local_executor.py), rather than on the worker threads Serve gives a sync method, where two calls
        # could touch the host's caches at once and the drafter's propose ran 5-17% slower (its compute in
        # `dlm bench --breakdown`).
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="dlm-host")
        global HOST
        HOST = self
        self.report_kv()

    def actor(self, replica: str | None = None) -> tuple[str, ActorHandle]:
        """This replica's unique id and its own actor; replica: the one the orchestrator asked for
        (services/serving/replica_router.py), which may be gone."""
        return self.replica, ray.get_runtime_context().current_actor

    def call(self, method: str, args: list[Args], parents: list[str] | None) -> list[Reply]:
        try:
            with stage_spans(self.deployment, method, parents, self.replica):
                return timed_call(self, self.deployment, method, args)
        finally:
            self.report_kv()

    async def release(self, request_ids: list[str], replica: str | None = None) -> None:
        """Through Serve, where the orchestrator holds no actor of the replica (direct.py)."""
        await asyncio.get_running_loop().run_in_executor(self.worker, self.free, request_ids)

    def free(self, request_ids: list[str]) -> None:
        super().release(request_ids)
        self.report_kv()

    def report_kv(self) -> None:
        if self.kv is not None:
            self.kv_usage.set(sum(self.kv.held().values()) / self.kv_budget)


def direct(replica_actor: object, method: str, args: list[Args], parents: list[str] | None) -> list[Reply]:
    """One batched host call, run on the replica's actor; parents: each call's round traceparent, or None untraced.
    It waits on the host's thread, holding the actor's event loop as a forward would (Serve's own calls wait)."""
    return HOST.worker.submit(HOST.call, method, args, parents).result()


def direct_release(replica_actor: object, request_ids: list[str]) -> None:
    HOST.worker.submit(HOST.free, request_ids)
