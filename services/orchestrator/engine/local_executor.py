"""The in-process executor: its hosts (hosts.py) load their models on first use, and a step's call groups run on them
one after another, on a worker thread so that an event loop serving clients never waits on a forward."""

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from services.common.compute import timed_call
from services.common.config import EngineConfig
from services.common.contract import ROLES, Groups, Parents, Results, kv_hosts
from services.common.models import ModelMeta
from services.common.placement import Placement
from services.common.threads import DEFAULT_THREADS, intra_op_threads
from services.common.tracing import stage_spans
from services.orchestrator.engine.hosts import HostPool

T = TypeVar("T")


class LocalExecutor(HostPool):
    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.roles = frozenset(config.models) | ({"drafter_ar"} if "drafter" in config.models else set())
        self.placement = Placement(kv_hosts(config.models), lambda host: ["local"], config.serving.kv_budget_tokens)
        self.resuming: set[str] = set()  # nothing is lost in process
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="dlm-step")
        self.worker.submit(intra_op_threads, config.threads or DEFAULT_THREADS).result()
        intra_op_threads(1)

    def filter_block_size(self, family: str) -> int:
        return self.host("filter").block_sizes()[family]

    def execute(self, groups: Groups, parents: Parents = None) -> asyncio.Future[Results]:
        return asyncio.get_running_loop().run_in_executor(self.worker, self.run, groups, parents)

    def call_on_worker(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on the forwards' thread, with its torch threads, waiting for it (mfu.py's matmul reference)."""
        return self.worker.submit(fn, *args).result()

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

    async def start(self) -> None:
        """A server's start: every model loaded, off the event loop."""
        await asyncio.get_running_loop().run_in_executor(self.worker, self.load_all, self.roles)


def first_model(config: EngineConfig) -> str:
    """The model whose tokenizer the engine speaks: all roles share one tokenizer."""
    for model in ("drafter", "drafter_bidirectional", "guider", "ar"):
        if model in config.models:
            return model
    raise ValueError("config names no model (models.drafter, models.guider, ...)")
