"""What every model deployment adds to its host on a replica: `run`, the one entry point of the orchestrator's
batched calls, which records a stage span per call (a child of the call's round, tagged with this replica) and
reports the replica's KV usage to Ray's metrics after each call."""

from typing import Any

from ray import serve
from ray.serve.metrics import Gauge

from services.common.calls import Reply
from services.common.kv_manager import KVManager
from services.common.tracing import stage_spans
from services.serving.pickling import unpack_args


class ReplicaHost:
    kv: KVManager | None = None  # the host's KV manager, where it keeps per-request caches

    def start_telemetry(self) -> None:
        context = serve.get_replica_context()
        self.deployment, self.replica = context.deployment, context.replica_id.unique_id
        self.kv_usage = Gauge("dlm_kv_cache_usage_perc", description="Fraction of the replica's KV budget reserved")
        self.report_kv()

    def run(
        self, method: str, args: list[Any], parents: list[str] | None = None, replica: str | None = None
    ) -> list[Reply]:
        """One batched host call; parents: each call's round traceparent, or None untraced; replica:
        where the orchestrator sent it (services/serving/replica_router.py), which may be gone."""
        try:
            with stage_spans(self.deployment, method, parents, self.replica):
                return getattr(self, method)(unpack_args(args))
        finally:
            self.report_kv()

    def release(self, request_ids: list[str], replica: str | None = None) -> None:
        super().release(request_ids)
        self.report_kv()

    def report_kv(self) -> None:
        if self.kv is not None:
            self.kv_usage.set(self.kv.usage())
