"""Which cache index a URL names; apart from both implementations so neither imports the other."""

import os

from services.common.config import REDIS_PASSWORD_ENV
from services.serving.cache_index import CacheIndex, EmbeddedCacheIndex


def make_index(url: str | None = None, **kwargs) -> CacheIndex:
    """RedisCacheIndex for a redis://, rediss:// or unix:// URL; EmbeddedCacheIndex for None, "" or memory://.
    The Redis password comes from DLM_REDIS_PASSWORD, so the URL in the config holds none (a password in the URL
    still wins)."""
    if not url or url.startswith("memory://"):
        return EmbeddedCacheIndex(**kwargs)
    from services.serving.redis_index import RedisCacheIndex  # the redis package only where a URL asks for it

    password = os.environ.get(REDIS_PASSWORD_ENV)
    if password:
        kwargs.setdefault("password", password)
    return RedisCacheIndex.from_url(url, **kwargs)
