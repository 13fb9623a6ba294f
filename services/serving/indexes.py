"""Which cache index a URL names; apart from both implementations so neither imports the other."""

from services.serving.cache_index import CacheIndex, EmbeddedCacheIndex


def make_index(url: str | None = None, **kwargs) -> CacheIndex:
    """RedisCacheIndex for a redis://, rediss:// or unix:// URL; EmbeddedCacheIndex for None, "" or memory://."""
    if not url or url.startswith("memory://"):
        return EmbeddedCacheIndex(**kwargs)
    from services.serving.redis_index import RedisCacheIndex  # the redis package only where a URL asks for it

    return RedisCacheIndex.from_url(url, **kwargs)
