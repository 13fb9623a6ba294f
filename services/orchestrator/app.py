"""The Ray Serve application: drafter, guider, AR baseline and filter deployments, and the orchestrator that runs
the round loop over their handles and serves gRPC. `serve deploy` takes `services.orchestrator.app:build_app`."""

from dataclasses import asdict

from ray import serve
from ray.serve.handle import DeploymentHandle

from services.ar_guider.deployment import GuiderDeployment
from services.common.config import DEFAULT_CONFIG, EngineConfig, replica_threads
from services.dlm_drafter.deployment import DrafterDeployment
from services.filter.deployment import FilterDeployment
from services.orchestrator.admission import KVAdmission
from services.orchestrator.backend import LocalBackend
from services.orchestrator.engine import Engine
from services.orchestrator.remote import RemoteModelPool
from services.orchestrator.server import Server
from services.serving.indexes import make_index


@serve.deployment(name="orchestrator", num_replicas=1)
class Orchestrator:
    async def __init__(self, config: dict, **handles: DeploymentHandle):
        cfg = EngineConfig(**config)
        replica_threads(cfg)
        serving = cfg.serving
        self.pool = RemoteModelPool(cfg, handles)
        replicas = {role: await handles[role].replica_id.remote() for role in ("drafter", "guider") if role in handles}
        self.index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
        admission = KVAdmission(
            self.index, replicas, serving.kv_budget_tokens, serving.max_queue, serving.request_ttl_s
        )
        self.backend = LocalBackend(Engine(cfg, models=self.pool), serving.max_concurrency, admission)
        self.server = Server(self.backend)
        self.port = await self.server.start(f"{cfg.serving.host}:{cfg.serving.port}")

    def address(self) -> str:
        return f"port {self.port}"

    def live(self) -> dict:
        """Requests holding state: in the orchestrator, and per model deployment."""
        return {"orchestrator": self.backend.live(), "index": self.index.storage_keys(), **self.pool.held()}

    def batch_sizes(self) -> dict:
        return {role: self.pool.handle(role).batch_sizes.remote().result() for role in ("drafter", "guider")}

    async def check_health(self) -> None:
        if not self.backend.ready:
            return  # models still loading: gRPC health says NOT_SERVING meanwhile


def build_app(args: dict | None = None):
    """args: {"config": path to the dlm YAML}; the same file `dlm serve` reads."""
    cfg = EngineConfig.from_yaml((args or {}).get("config", DEFAULT_CONFIG))
    config, serving = asdict(cfg), cfg.serving
    batching = {"max_batch_size": serving.max_batch_size, "batch_wait_timeout_s": serving.batch_wait_timeout_s}
    quiet = {"log_level": "WARNING", "enable_access_log": False}  # a log line per call costs a hop's worth of CPU
    model = {
        "ray_actor_options": {"num_gpus": serving.num_gpus, "num_cpus": 0 if serving.num_gpus else 0.5},
        "max_ongoing_requests": max(4 * serving.max_batch_size, serving.max_concurrency),
        "logging_config": quiet,
    }
    handles = {}
    if {"drafter", "drafter_bidirectional"} & set(cfg.models):
        handles["drafter"] = DrafterDeployment.options(**model).bind(config, **batching)
    if "guider" in cfg.models:
        handles["guider"] = GuiderDeployment.options(**model).bind(config, "guider", **batching)
    if "ar" in cfg.models:
        handles["ar"] = GuiderDeployment.options(name="ar", **model).bind(config, "ar", **batching)
    if "filter" in cfg.models:
        filter_options = {**model, "ray_actor_options": {"num_cpus": 0}}
        handles["filter"] = FilterDeployment.options(**filter_options).bind(config, **batching)
    orchestrator = {"ray_actor_options": {"num_cpus": 0.5}, "logging_config": quiet, "max_ongoing_requests": 1000}
    return Orchestrator.options(**orchestrator).bind(config, **handles)
