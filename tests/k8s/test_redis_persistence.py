"""Redis as k8s/redis.yaml runs it keeps the cache index's records through a restart: a redis-server started with
the manifest's own arguments (its volume's directory replaced by a temporary one, on a free loopback port), a
request's record and reservations written through the index as the default user, the server SIGKILLed (no shutdown
save; the pod's OOM kill or node loss) and started again with the same arguments on the same directory."""

import asyncio
import re
import shutil
import signal
import subprocess
import tempfile

import pytest

from services.serving.cache_index import IndexEntry, IndexUnavailable
from services.serving.redis_index import RedisCacheIndex
from services.serving.redis_process import find_redis_server, free_port
from tests.k8s.manifests import find

pytestmark = pytest.mark.anyio

SECRETS = {"INDEX_PASSWORD": "index-secret", "GCS_PASSWORD": "gcs-secret"}


def manifest_args(data_dir: str, port: int) -> list[str]:
    """The container's command line as the kubelet expands it, on this directory and port."""
    pod = find("Deployment", "dlm-redis")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/data"]
    assert any(v["name"] == mount["name"] and "persistentVolumeClaim" in v for v in pod["volumes"])
    args = [re.sub(r"\$\((\w+)\)", lambda m: SECRETS[m.group(1)], a) for a in container["args"]]
    args = [data_dir if a == mount["mountPath"] else a for a in args]
    assert args[0] == "redis-server"
    return [find_redis_server(), *args[1:], "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "no"]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def answered(index: RedisCacheIndex) -> None:
    for _ in range(200):
        try:
            await index.requests()
            return
        except IndexUnavailable:
            await asyncio.sleep(0.05)
    raise AssertionError("redis-server never answered")


async def test_a_redis_restart_keeps_the_records():
    if find_redis_server() is None:
        pytest.skip("no redis-server binary")
    data, port = tempfile.mkdtemp(prefix="dlm-redis-aof-"), free_port()
    args = manifest_args(data, port)
    url = f"redis://127.0.0.1:{port}/0"
    index = RedisCacheIndex.from_url(url, password=SECRETS["INDEX_PASSWORD"], default_ttl_s=600)
    server = start(args)
    try:
        await answered(index)
        entry = IndexEntry("kept", "d0", "g0", 3, [7, 8, 9], [0, 2, 1], "pipeline", {"window": 6}, owner="orch-a")
        entry.ttl_s, entry.snapshot, entry.streamed = 600.0, b"\x00state", 2
        await index.put(entry)
        assert await index.place("kept", [["d0"], ["g0"]], 40, budget=100) == ["d0", "g0"]
        await asyncio.sleep(1.5)  # appendfsync everysec: what is older than a second is on disk
        server.send_signal(signal.SIGKILL)
        server.wait()
        server = start(args)
        await answered(index)
        assert await index.get("kept") == entry
        assert await index.holdings("d0") == {"kept": 40} == await index.holdings("g0")
    finally:
        await index.close()
        server.kill()
        server.wait()
        shutil.rmtree(data)
