"""The Ray Serve deployment of model replicas: each replica runs the hosts it is given (services/serving/replica.py),
made as the in-process executor makes them (engine/hosts.py). Separate, one deployment per host (`drafter` hosts the
causal and the bidirectional drafter, `filter` both filters, `guider`, `ar`), each replica on one model's device;
colocated (serving.colocate), one deployment `models` whose replicas run every host, for machines where the models
share one device. The orchestrator's step sends each batched method one list of every live request's arguments, so no
@serve.batch is needed while one orchestrator runs."""

import psutil
from ray import serve

from services.common.config import EngineConfig
from services.common.contract import served_hosts
from services.orchestrator.engine.hosts import HostPool
from services.serving.replica import ReplicaHost

COLOCATED = "models"  # the deployment whose replicas run every host (serving.colocate)


@serve.deployment
class ModelDeployment(ReplicaHost):
    def __init__(self, config: dict, hosts: list[str]):
        cfg = EngineConfig(**config)
        pool = HostPool(cfg)
        made = {host: pool.host(host) for host in hosts}
        self.start_replica(made, cfg.serving.kv_budget_tokens, replica_threads(cfg, cfg.serving.colocate))


def replica_threads(config: EngineConfig, colocated: bool) -> int | None:
    """A replica's torch threads: the config's `threads`; else on CPU serving.replica_threads for one of several
    deployments that share the cores, and one per core for a colocated replica, as torch's default in process (Ray
    sets a worker's OMP_NUM_THREADS to the CPUs it reserved, here less than one)."""
    if config.threads or config.device != "cpu":
        return config.threads
    return psutil.cpu_count(logical=False) if colocated else config.serving.replica_threads


def layout(config: EngineConfig) -> dict[str, list[str]]:
    """Serve deployment -> the hosts its replicas run, for the hosts a config's models need."""
    hosts = served_hosts(config.models)
    return {COLOCATED: hosts} if config.serving.colocate else {host: [host] for host in hosts}
