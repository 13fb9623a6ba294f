"""The model hosts of one process, each made on first use, its models loaded once: the in-process executor's
(local_executor.py), and a model replica's when served (orchestrator/cluster/model_deployment.py), so that a replica
runs exactly the hosts the in-process engine calls."""

from services.ar_guider.host import GuiderHost
from services.common.config import EngineConfig
from services.common.contract import ROLES, host_of
from services.common.models import LoadedModel, load_model
from services.dlm_drafter.host import DrafterHost
from services.filter.host import FilterHost, configured_filters

Host = DrafterHost | GuiderHost | FilterHost


class HostPool:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.loaded: dict[str, LoadedModel] = {}  # models key -> its weights
        self.hosts: dict[str, Host] = {}  # host name (contract.ROLES) -> the host made so far

    def load(self, model: str) -> LoadedModel:
        if model not in self.loaded:
            config = self.config
            self.loaded[model] = load_model(config.path(model), config.device, config.dtype, config.cpu_kernels)
        return self.loaded[model]

    def host(self, name: str) -> Host:
        if name not in self.hosts:
            self.hosts[name] = self.make_host(name)
        return self.hosts[name]

    def make_host(self, name: str) -> Host:
        models = self.config.models
        if name == "drafter":
            causal = self.load("drafter") if "drafter" in models else None
            bidirectional = self.load("drafter_bidirectional") if "drafter_bidirectional" in models else None
            return DrafterHost(causal, bidirectional)
        if name == "filter":
            return FilterHost(configured_filters(models))
        return GuiderHost(self.load(ROLES[name].model))

    def load_all(self, models: frozenset[str]) -> None:
        """Make the hosts of these models keys now rather than on first use."""
        for model in models:
            self.host(host_of(model))
