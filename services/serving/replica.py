"""What a model replica is on top of its hosts (one, or every host when colocated: serving.colocate): the channel
(services/serving/channel.py) that takes the orchestrator's batched calls (services/common/contract.py), each naming
its host and recording a stage span (a child of the call's round, tagged with this replica), and the replica's KV
usage reported to Ray's metrics.

Serve places, scales, restarts and health-checks the replica; `endpoint` hands an orchestrator the replica's channel
through a Serve call (services/serving/direct.py)."""

import asyncio
import pickle
from typing import Any

import ray
import torch
from ray import serve
from ray.serve.metrics import Gauge

import services.serving.pickling  # noqa: F401  the contract's classes cross the hop compactly
from services.common.compute import timed_call
from services.common.contract import Args, Reply
from services.common.kv_manager import KVManager
from services.common.threads import intra_op_threads
from services.common.tracing import stage_spans
from services.serving.channel import ChannelServer
from services.serving.request_sync import Mirror

Endpoint = tuple[str, tuple[str, int], bytes]  # the replica's unique id, its channel's address and token


class ReplicaHost:
    def start_replica(self, hosts: dict[str, Any], kv_budget_tokens: int, threads: int | None) -> None:
        """hosts: host name (contract.ROLES) -> the host that runs its calls here; threads: torch's intra-op threads
        of its forwards (None: as the process has them)."""
        context = serve.get_replica_context()
        self.deployment, self.replica = context.deployment, context.replica_id.unique_id
        self.hosts, self.kv_budget = hosts, kv_budget_tokens
        self.kv = [host.kv for host in hosts.values() if isinstance(getattr(host, "kv", None), KVManager)]
        self.kv_usage = Gauge("dlm_kv_cache_usage_perc", description="Fraction of the replica's KV budget cached")
        # The host's calls and releases run one at a time on the channel's thread, as in process on the executor's
        # (engine/local_executor.py), rather than on the worker threads Serve gives a sync method, where two calls
        # could touch the host's caches at once and the drafter's propose ran 5-17% slower (its compute in
        # `dlm bench --breakdown`).
        self.channel = ChannelServer(ray.util.get_node_ip_address(), self.answer, Mirror)
        if threads:  # set on the thread that runs the forwards: each OpenMP thread leads a team of its own
            self.channel.submit(intra_op_threads, threads).result()
        self.report_kv()

    def endpoint(self, replica: str | None = None) -> Endpoint:
        """This replica's channel; replica: the one the orchestrator asked for (services/serving/replica_router.py),
        which may be gone."""
        return self.replica, self.channel.address, self.channel.token

    def answer(self, payload: bytes, mirror: Mirror) -> bytes:
        """A channel frame, on the host's thread, with its connection's copies of the requests (request_sync.py):
        ("call", host, method, args, parents) -> ("ok", replies) or ("error", exception); ("release", host,
        request_ids) -> nothing."""
        kind, host, *rest = pickle.loads(payload)
        if kind == "release":
            mirror.forget(host, *rest)
            self.free(host, *rest)
            return b""
        method, args, parents = rest
        try:
            return pickle.dumps(("ok", self.call(host, method, [mirror.incoming(a) for a in args], parents)))
        except Exception as e:  # fails the requests of this call only, as in process
            return pickle.dumps(("error", e))

    def call(self, host: str, method: str, args: list[Args], parents: list[str] | None) -> list[Reply]:
        try:
            with stage_spans(host, method, parents, self.replica):
                return timed_call(self.hosts[host], host, method, args)
        finally:
            # once the reply is written (this runs on the channel's loop): setting the gauge took 0.08 ms of each
            # call's round trip
            self.channel.loop.call_soon(self.report_kv)

    async def release(self, host: str, request_ids: list[str], replica: str | None = None) -> None:
        """Through Serve, where the orchestrator holds no channel to the replica (direct.py)."""
        await asyncio.wrap_future(self.channel.submit(self.free, host, request_ids))

    def free(self, host: str, request_ids: list[str]) -> None:
        self.hosts[host].release(request_ids)
        self.report_kv()

    def held(self, host: str) -> dict[str, int]:
        """Request id -> KV tokens the host caches for it here."""
        return self.hosts[host].held()

    async def threads(self) -> int:
        """Torch's intra-op threads of this replica's forwards."""
        return await asyncio.wrap_future(self.channel.submit(torch.get_num_threads))

    def block_sizes(self) -> dict[str, int]:
        return self.hosts["filter"].block_sizes()

    def check_health(self) -> None:
        for host in self.hosts.values():
            host.check_health()

    def report_kv(self) -> None:
        if self.kv:
            self.kv_usage.set(sum(sum(kv.held().values()) for kv in self.kv) / self.kv_budget)
