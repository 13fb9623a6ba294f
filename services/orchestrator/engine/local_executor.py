"""In-process hosts: each role's model loads on first use, and a step's call groups run on them one after another."""

import asyncio

from services.ar_guider.host import GuiderHost
from services.common.config import EngineConfig
from services.common.models import LoadedModel, ModelMeta, load_model
from services.common.tracing import stage_spans
from services.dlm_drafter.host import DrafterHost
from services.filter.host import FilterHost, configured_filters
from services.orchestrator.decode.round import Groups, Parents, Results

Host = DrafterHost | GuiderHost | FilterHost
HOSTS = {"drafter_bidirectional": "drafter", "filter_bidirectional": "filter"}  # roles another role's host serves


class ModelPool:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.loaded: dict[str, LoadedModel] = {}
        self.hosts: dict[str, Host] = {}
        self.roles = frozenset(config.models) | ({"drafter_ar"} if "drafter" in config.models else set())

    def load(self, role: str) -> LoadedModel:
        if role not in self.loaded:
            reordered = role == "drafter"
            self.loaded[role] = load_model(self.config.path(role), self.config.device, self.config.dtype, reordered)
        return self.loaded[role]

    def host(self, role: str) -> Host:
        if role not in self.hosts:
            self.hosts[role] = self.make_host(role)
        return self.hosts[role]

    def make_host(self, role: str) -> Host:
        budget = self.config.serving.kv_budget_tokens
        if role == "drafter":
            models = self.config.models
            causal = self.load("drafter") if "drafter" in models else None
            bidirectional = self.load("drafter_bidirectional") if "drafter_bidirectional" in models else None
            return DrafterHost(causal, bidirectional, budget)
        if role == "filter":
            return FilterHost(*configured_filters(self.config.models))
        return GuiderHost(self.load("drafter" if role == "drafter_ar" else role), budget)

    def filter_block_size(self, drafter: str) -> int:
        return self.host("filter").block_sizes()[drafter]

    def execute(self, groups: Groups, parents: Parents = None) -> Results:
        results: Results = {}
        for (role, method), args in groups.items():
            try:
                with stage_spans(role, method, parents and parents[role, method], "local"):
                    results[role, method] = getattr(self.host(role), method)(args)
            except Exception as e:  # fails the requests of this group only
                results[role, method] = e
        return results

    def release(self, role: str, request_ids: list[str]) -> None:
        if role in self.hosts:
            self.hosts[role].release(request_ids)

    def meta(self) -> ModelMeta:
        return self.load(first_role(self.config)).meta

    def load_all(self) -> None:
        """Load every configured model now rather than on first use."""
        for role in self.roles:
            self.host(HOSTS.get(role, role))

    async def start(self) -> None:
        """A server's start: every model loaded, off the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.load_all)


def first_role(config: EngineConfig) -> str:
    """The model whose tokenizer the engine speaks: all roles share one tokenizer."""
    for role in ("drafter", "drafter_bidirectional", "guider", "ar"):
        if role in config.models:
            return role
    raise ValueError("config names no model (models.drafter, models.guider, ...)")
