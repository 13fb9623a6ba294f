"""The Ray Serve application: drafter, guider, AR baseline and filter deployments, and the orchestrator that steps
the engine over their handles and serves gRPC, and the OpenAI HTTP API on the Serve proxy (its ingress).
`serve deploy` takes `services.orchestrator.app:build_app`."""

import asyncio
from dataclasses import asdict

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ray import serve
from ray.serve.handle import DeploymentHandle

from services.ar_guider.deployment import GuiderDeployment
from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.dlm_drafter.deployment import DrafterDeployment
from services.filter.deployment import FilterDeployment
from services.orchestrator.admission import IndexAdmission
from services.orchestrator.async_engine import AsyncEngine
from services.orchestrator.backend import EngineBackend
from services.orchestrator.metrics import ServeMetrics
from services.orchestrator.openai_api import api, attach
from services.orchestrator.remote import RemoteHosts
from services.orchestrator.server import Server
from services.orchestrator.telemetry import Telemetry
from services.serving.indexes import make_index

HEALTH_TIMEOUT_S = 10.0  # under Serve's default health_check_timeout_s (30)


@serve.deployment(name="orchestrator", num_replicas=1)
@serve.ingress(api)
class Orchestrator:
    async def __init__(self, config: dict, **handles: DeploymentHandle):
        cfg = EngineConfig(**config)
        torch.set_num_threads(1)  # its torch work is per-request bookkeeping (sampling, gates); forwards run elsewhere
        serving = cfg.serving
        self.hosts = RemoteHosts(cfg, handles)
        replicas = {role: await handle.replica_id.remote() for role, handle in handles.items()}
        self.index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
        kv_replicas = {role: replicas[role] for role in ("drafter", "guider") if role in replicas}
        admission = IndexAdmission(self.index, kv_replicas, serving.kv_budget_tokens, serving.request_ttl_s)
        metrics = ServeMetrics()
        engines = [
            AsyncEngine(cfg, self.hosts, admission, Telemetry(cfg, metrics, replicas, engine=i))
            for i in range(serving.micro_batches)
        ]
        self.backend = EngineBackend(*engines)
        attach(self.backend, serving.limits)
        self.server = Server(self.backend, serving.limits)
        self.port = await self.server.start(f"{serving.host}:{serving.port}")
        local = "127.0.0.1" if serving.host in ("0.0.0.0", "::", "[::]") else serving.host
        self.channel = grpc.aio.insecure_channel(f"{local}:{self.port}")

    def address(self) -> str:
        return f"port {self.port}"

    def requests(self) -> list[str]:
        """Requests the orchestrator holds (queued or decoding); answers while a model replica is stalled."""
        return self.backend.live()

    async def live(self) -> dict:
        """Requests holding state: in the orchestrator, in the index, and per model deployment."""
        index = await self.index.storage_keys()
        return {"orchestrator": self.backend.live(), "index": index, **await self.hosts.held()}

    def batch_sizes(self) -> dict:
        """Per deployment, batch size -> calls the orchestrator sent it."""
        return {role: dict(sizes) for role, sizes in self.hosts.batches.items()}

    async def check_health(self) -> None:
        """Serve restarts this replica when it raises: the gRPC server does not answer its health service, or,
        once the models have loaded, a model deployment does not answer its health check."""
        await health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=HEALTH_TIMEOUT_S)
        if not self.backend.ready:
            return  # models still loading: gRPC health says NOT_SERVING meanwhile
        roles = list(self.hosts.handles)
        checks = [asyncio.wait_for(self.hosts.handles[role].check_health.remote(), HEALTH_TIMEOUT_S) for role in roles]
        done = await asyncio.gather(*checks, return_exceptions=True)
        down = {role: repr(e) for role, e in zip(roles, done, strict=True) if isinstance(e, BaseException)}
        if down:
            raise RuntimeError(f"model deployments down: {down}")


def build_app(args: dict | None = None):
    """args: {"config": path to the dlm YAML}; the same file `dlm serve` reads."""
    cfg = EngineConfig.from_yaml((args or {}).get("config", DEFAULT_CONFIG))
    config, serving = asdict(cfg), cfg.serving
    quiet = {"log_level": "WARNING", "enable_access_log": False}  # a log line per call costs a hop's worth of CPU
    # OpenMP threads that finish a forward sleep at once instead of spinning: the stages of a step run one after
    # another, so each replica may use every core while the others wait (a spinning one would hold a core).
    passive = {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}}
    model = {
        "ray_actor_options": {
            "num_gpus": serving.num_gpus,
            "num_cpus": 0 if serving.num_gpus else 0.5,
            "runtime_env": passive,
        },
        "max_ongoing_requests": 16,  # a step sends each method one call; releases and health checks come beside
        "logging_config": quiet,
    }
    handles = {}
    if {"drafter", "drafter_bidirectional"} & set(cfg.models):
        handles["drafter"] = DrafterDeployment.options(**model).bind(config)
    if "guider" in cfg.models:
        handles["guider"] = GuiderDeployment.options(**model).bind(config, "guider")
    if "ar" in cfg.models:
        handles["ar"] = GuiderDeployment.options(name="ar", **model).bind(config, "ar")
    if "filter" in cfg.models:
        filter_options = {**model, "ray_actor_options": {"num_cpus": 0, "runtime_env": passive}}
        handles["filter"] = FilterDeployment.options(**filter_options).bind(config)
    logs = {"log_level": serving.log_level, "enable_access_log": False}  # a JSON line per finished request at INFO
    orchestrator = {
        "ray_actor_options": {"num_cpus": 0.5, "runtime_env": passive},
        "logging_config": logs,
        "max_ongoing_requests": 1000,
    }
    return Orchestrator.options(**orchestrator).bind(config, **handles)
