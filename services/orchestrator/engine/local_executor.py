"""The in-process executor: each host loads its models on first use, and a step's call groups run on them one after
another, on a worker thread so that an event loop serving clients never waits on a forward."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch

from services.ar_guider.host import GuiderHost
from services.common.compute import timed_call
from services.common.config import EngineConfig
from services.common.contract import ROLES, Groups, Parents, Results, host_of, kv_hosts
from services.common.models import LoadedModel, ModelMeta, load_model
from services.common.placement import Placement
from services.common.tracing import stage_spans
from services.dlm_drafter.host import DrafterHost
from services.filter.host import FilterHost, configured_filters

Host = DrafterHost | GuiderHost | FilterHost
DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice, one per core, before any engine changed it


class LocalExecutor:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.loaded: dict[str, LoadedModel] = {}
        self.hosts: dict[str, Host] = {}
        self.roles = frozenset(config.models) | ({"drafter_ar"} if "drafter" in config.models else set())
        self.placement = Placement(kv_hosts(config.models), lambda host: ["local"], config.serving.kv_budget_tokens)
        self.resuming: set[str] = set()  # nothing is lost in process
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="dlm-step")
        self.worker.submit(intra_op_threads, config.threads or DEFAULT_THREADS).result()
        intra_op_threads(1)

    def load(self, model: str) -> LoadedModel:
        if model not in self.loaded:
            self.loaded[model] = load_model(self.config.path(model), self.config.device, self.config.dtype)
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

    def filter_block_size(self, family: str) -> int:
        return self.host("filter").block_sizes()[family]

    def execute(self, groups: Groups, parents: Parents = None) -> asyncio.Future[Results]:
        return asyncio.get_running_loop().run_in_executor(self.worker, self.run, groups, parents)

    def run(self, groups: Groups, parents: Parents) -> Results:
        results: Results = {}
        for (role, method), args in groups.items():
            try:
                name = ROLES[role].host
                with stage_spans(role, method, parents and parents[role, method], "local"):
                    results[role, method] = timed_call(self.host(name), name, method, args)
            except Exception as e:  # fails the requests of this group only
                results[role, method] = e
        return results

    def release(self, host: str, request_ids: list[str]) -> None:
        if host in self.hosts:
            self.hosts[host].release(request_ids)

    def meta(self) -> ModelMeta:
        return self.load(first_model(self.config)).meta

    def load_all(self) -> None:
        """Load every configured model now rather than on first use."""
        for model in self.roles:
            self.host(host_of(model))

    async def start(self) -> None:
        """A server's start: every model loaded, off the event loop."""
        await asyncio.get_running_loop().run_in_executor(self.worker, self.load_all)


def intra_op_threads(n: int) -> None:
    """Torch's intra-op threads for the calling thread, and for threads that run torch later.

    With OpenMP, each thread that runs a parallel op leads a team of its own. The forwards run on the worker with
    `threads`; the stages' ops run on the event loop's thread, and one elementwise op there over a vocabulary row
    starts a second team. With more OpenMP threads than cores libgomp stops spinning between parallel regions, and
    every later forward ran at half speed (drafter 6.6 -> 12.6 ms, guider 3.0 -> 6.2 ms, once an `ar` request ran).
    """
    torch.get_num_threads()  # this thread's first use of the pool reads the default; let it happen before the set
    torch.set_num_threads(n)


def first_model(config: EngineConfig) -> str:
    """The model whose tokenizer the engine speaks: all roles share one tokenizer."""
    for model in ("drafter", "drafter_bidirectional", "guider", "ar"):
        if model in config.models:
            return model
    raise ValueError("config names no model (models.drafter, models.guider, ...)")
