"""In process, the forwards run on the executor's worker with the intra-op threads; the thread that built the engine,
where its stages run, never leads an OpenMP team of its own (local_executor.py, intra_op_threads)."""

import os

import torch

from services.common.config import EngineConfig
from services.orchestrator.engine.local_executor import LocalExecutor


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_only_the_forward_thread_runs_torch_ops_in_parallel(tiny_zoo):
    executor = LocalExecutor(EngineConfig(models=tiny_zoo, threads=2))
    assert executor.worker.submit(torch.get_num_threads).result() == 2
    assert torch.get_num_threads() == 1
    before = os_threads()
    torch.randn(4, 1 << 16).exp()  # large enough to run in parallel on a thread with a team
    assert os_threads() == before
