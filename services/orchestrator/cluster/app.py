"""The Ray Serve application: the model deployments (model_deployment.py), and the orchestrator that steps
the engine over their handles and serves gRPC, and the OpenAI HTTP API on the Serve proxy (its ingress).
`serve deploy` takes `services.orchestrator.cluster.app:build_app`.

The orchestrator may run several replicas (serving.replicas.orchestrator): each serves gRPC on serving.port, which
they share (SO_REUSEPORT: the kernel spreads new connections over them), the Serve proxy spreads OpenAI requests over
them, and they share the model replicas, whose KV budget each reserves in the cache index (admission.py)."""

import asyncio
import time
from dataclasses import asdict

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.orchestrator.api.frontend import Frontend
from services.orchestrator.api.grpc_server import Server
from services.orchestrator.api.openai_api import api, attach
from services.orchestrator.cluster.admission import IndexAdmission
from services.orchestrator.cluster.metrics import ServeMetrics
from services.orchestrator.cluster.model_deployment import COLOCATED, ModelDeployment, layout
from services.orchestrator.cluster.remote_executor import RemoteExecutor
from services.orchestrator.cluster.serve_logs import to_serve_log
from services.orchestrator.cluster.sweep import Sweep
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.telemetry import Telemetry
from services.serving.direct import DirectHandle
from services.serving.indexes import make_index
from services.serving.replica_router import PinnedRouter
from services.serving.security import api_key

HEALTH_TIMEOUT_S = 10.0  # under Serve's default health_check_timeout_s (30)


@serve.deployment(name="orchestrator", num_replicas=1)
@serve.ingress(api)
class Orchestrator:
    async def __init__(self, config: dict, **handles: DeploymentHandle):
        cfg = EngineConfig(**config)
        to_serve_log(cfg.serving.log_level)
        torch.set_num_threads(1)  # its torch work is per-request bookkeeping (sampling, gates); forwards run elsewhere
        serving = cfg.serving
        hosts = {host: DirectHandle(handles[name], host) for name, served in layout(cfg).items() for host in served}
        self.hosts = RemoteExecutor(cfg, hosts)
        self.down_since: dict[str, tuple[float, str]] = {}  # model deployment -> (when it stopped answering, why)
        self.index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
        owner = serve.get_replica_context().replica_id.unique_id  # a restarted replica is a new owner
        admission = IndexAdmission(self.index, self.hosts.placement, serving.request_ttl_s, owner, serving.lease_s)
        metrics = ServeMetrics()
        engines = [
            Engine(cfg, self.hosts, admission, Telemetry(cfg, metrics, self.hosts.replica_of, engine=i))
            for i in range(serving.engines)
        ]
        self.backend = Frontend(*engines, records=admission)
        attach(self.backend, serving.limits, api_key(serving.api_key_file))
        self.server = Server(self.backend, serving.limits)
        self.port = await self.server.start(f"{serving.host}:{serving.port}", shared=True)  # every replica's port
        self.owner = owner
        self.sweep = Sweep(self.backend, self.index, serving.lease_s)  # adopts the requests of dead orchestrators
        self.sweep.start()
        self.channel = grpc.aio.insecure_channel(self.server.local_target(serving.host))

    def address(self) -> str:
        return f"port {self.port}"

    def replica(self) -> str:
        """This replica's id: its requests' owner in the cache index."""
        return self.owner

    def requests(self) -> list[str]:
        """Requests the orchestrator holds (queued or decoding); answers while a model replica is stalled."""
        return self.backend.live()

    async def live(self) -> dict:
        """Requests holding state: in the orchestrator, in the index, and per model deployment."""
        index = await self.index.storage_keys()
        return {"orchestrator": self.backend.live(), "index": index, **await self.hosts.held()}

    def placements(self) -> dict[str, dict[str, str]]:
        """Request id -> deployment -> the replica holding its KV."""
        return {rid: dict(where) for rid, where in self.hosts.placement.where.items()}

    def batch_sizes(self) -> dict:
        """Per deployment, batch size -> calls the orchestrator sent it."""
        return {role: dict(sizes) for role, sizes in self.hosts.batches.items()}

    async def check_health(self) -> None:
        """Serve restarts this replica when it raises: the gRPC server does not answer its health service, or,
        once the models have loaded, a model deployment has not answered its health check for
        serving.resume_timeout_s. Not at once: while Serve restarts a model replica, the requests on it wait to resume
        here, and restarting the orchestrator would lose them."""
        await health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=HEALTH_TIMEOUT_S)
        if not self.backend.ready:
            return  # models still loading: gRPC health says NOT_SERVING meanwhile
        deployments = self.hosts.deployments()
        checks = [asyncio.wait_for(h.check_health.remote(), HEALTH_TIMEOUT_S) for h in deployments.values()]
        done = await asyncio.gather(*checks, return_exceptions=True)
        now = time.monotonic()
        for name, result in zip(deployments, done, strict=True):
            if isinstance(result, BaseException):
                self.down_since.setdefault(name, (now, repr(result)))
            else:
                self.down_since.pop(name, None)
        grace = self.hosts.config.serving.resume_timeout_s
        down = {name: why for name, (since, why) in self.down_since.items() if now - since >= grace}
        if down:
            raise RuntimeError(f"model deployments down for over {grace} s: {down}")


# Two malloc arenas: with glibc's default (8 per core) the guider's RSS grew 21% over a 5-minute soak of ever larger
# packed batches; with 2 it stayed within 1% (tests/soak/soak.py).
COLOCATED_ENV = {"MALLOC_ARENA_MAX": "2"}
# OpenMP threads that finish a forward sleep at once instead of spinning: the stages of a step run one after another,
# so each replica may use every core while the others wait (a spinning one would hold a core). A colocated replica's
# team of one thread per core spins as in process: sleeping, its threads woke for each op, and the drafter's forward
# at c=1 took 11.7 ms against 7.5 (`dlm bench --breakdown`, compute drafter).
REPLICA_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", **COLOCATED_ENV}


def build_app(args: dict | None = None):
    """args: {"config": path to the dlm YAML}; the same file `dlm serve` reads."""
    cfg = EngineConfig.from_yaml((args or {}).get("config", DEFAULT_CONFIG))
    config, serving = asdict(cfg), cfg.serving
    quiet = {"log_level": "WARNING", "enable_access_log": False}  # a log line per call costs a hop's worth of CPU
    passive = {"env_vars": REPLICA_ENV}
    model = {
        "ray_actor_options": {
            "num_gpus": serving.num_gpus,
            "num_cpus": 0 if serving.num_gpus else 0.5,
            "runtime_env": passive,
        },
        "max_ongoing_requests": 16,  # a step sends each method one call; releases and health checks come beside
        "logging_config": quiet,
    }
    # Calls go to the replica holding their requests' KV. Without serving.replicas, Serve's default (1) or the Serve
    # config's num_replicas / autoscaling_config decide how many run.
    pinned = {**model, "request_router_config": RequestRouterConfig(request_router_class=PinnedRouter)}

    def options(deployment: str, base: dict) -> dict:
        count, resources = serving.replicas.get(deployment), serving.resources.get(deployment)
        out = {**base, "name": deployment, **({"num_replicas": count} if count else {})}
        if resources:  # placed on the nodes that offer these
            out["ray_actor_options"] = {**base["ray_actor_options"], "resources": dict(resources)}
        return out

    stateless = {**pinned, "ray_actor_options": {"num_cpus": 0, "runtime_env": passive}}  # the filters' small MLP
    spinning = {**model["ray_actor_options"], "runtime_env": {"env_vars": COLOCATED_ENV}}
    colocated = {**pinned, "ray_actor_options": spinning}
    kinds = {COLOCATED: colocated, "filter": stateless}
    handles = {
        name: ModelDeployment.options(**options(name, kinds.get(name, pinned))).bind(config, hosts)
        for name, hosts in layout(cfg).items()
    }
    logs = {"log_level": serving.log_level, "enable_access_log": False}  # a JSON line per finished request at INFO
    # the orchestrator replicas together ask what one asks: `dlm serve` on 2 cores fits the models and them
    orchestrators = serving.replicas.get("orchestrator", 1)
    orchestrator = {
        "ray_actor_options": {"num_cpus": 0.5 / orchestrators, "runtime_env": passive},
        "logging_config": logs,
        "max_ongoing_requests": 1000,
    }
    return Orchestrator.options(**options("orchestrator", orchestrator)).bind(config, **handles)
