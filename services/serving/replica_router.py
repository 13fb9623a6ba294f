"""Routing a model call to the replica that holds its requests' KV.

Serve's default router spreads calls over replicas by queue length; our calls carry KV state, so the orchestrator
names the replica (`run(..., replica=<unique id>)`) and `PinnedRouter` sends the call there. A call whose replica is
gone goes to any live one, which rebuilds the KV it lacks from the request it is sent (prompt + committed ids in
physical order, with their logical positions: the index record).

The routers run in the process that holds the handles (the orchestrator), and publish the replicas they route to
(services/serving/live_replicas.py), so that the orchestrator places new requests on live replicas and notices when
one has gone.
"""

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from services.serving import live_replicas


class PinnedRouter(FIFOMixin, RequestRouter):
    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.publish()

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.publish()

    def publish(self) -> None:
        live_replicas.LIVE[self._deployment_id.name] = sorted(r.unique_id for r in self.curr_replicas)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None:
            return [candidate_replicas]
        pending_request.routing_context.should_backoff = True  # a busy pinned replica: wait, do not spin
        target = pending_request.kwargs.get("replica")
        pinned = [r for r in candidate_replicas if r.replica_id.unique_id == target]
        return [pinned] if pinned else [candidate_replicas]
