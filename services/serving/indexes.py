"""The cache index a URL names: Redis, always (`dlm serve` starts a redis-server of its own when the config names
none)."""

import os

from services.common.config import REDIS_PASSWORD_ENV
from services.serving.cache_index import CacheIndex
from services.serving.redis_index import RedisCacheIndex


def make_index(url: str | None, **kwargs) -> CacheIndex:
    """RedisCacheIndex for a redis://, rediss:// or unix:// URL. The Redis password comes from DLM_REDIS_PASSWORD, so
    the URL in the config holds none (a password in the URL still wins). ValueError without a URL."""
    if not url:
        raise ValueError(
            "serving.redis_url is not set: the cache index lives in Redis (`dlm serve` starts a redis-server itself "
            "and sets it; `serve deploy` needs serving.redis_url in the config)"
        )
    password = os.environ.get(REDIS_PASSWORD_ENV)
    if password:
        kwargs.setdefault("password", password)
    return RedisCacheIndex.from_url(url, **kwargs)
