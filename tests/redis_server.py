"""The tests' redis-server is the one `dlm serve` starts (services/serving/redis_process.py). Without a binary, tests
fail when CI is set (CI=true) and are skipped otherwise."""

import os

import pytest

from services.serving.redis_process import INSTALL_HINT, find_redis_server, free_port, redis_process

__all__ = ["find_redis_server", "free_port", "redis_process", "unavailable"]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str):
    """Fail loudly in CI, skip with the reason elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this is an error; install with: {INSTALL_HINT})", pytrace=False)
    pytest.skip(f"{reason}; install with: {INSTALL_HINT}")
