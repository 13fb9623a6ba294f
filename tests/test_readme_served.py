"""What the README promises of a served run holds: `dlm serve` and `dlm serve --local` started as it starts them (on
free ports), its served examples print what it shows, the ports `dlm serve` configures bind serving.host, the
orchestrator's log holds one JSON line per finished request, scripts/cpu_per_token.py reads a served token's CPU by
process, and Ctrl-C stops it cleanly."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from services.cli.client import DlmClient
from tests.orchestrator.cluster.test_services import free_port
from tests.readme import DLM, PORTS, ROOT, examples, localize, matches, run, run_script
from tests.written import whole_lines

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SERVED = [e for e in examples() if e.server is not None]
LOG_KEYS = {"request_id", "strategy", "prompt_tokens", "output_tokens", "rounds", "tpf", "p_cache", "ttft_s"}
LOG_KEYS |= {"latency_s", "tpot_s", "finish_reason", "replicas"}  # README, "Operating from the Ray dashboard"
SPURIOUS = ("graceful_shutdown failed", "will not be applied", "Traceback")


class Server:
    """A `dlm serve` process in a session of its own (Ctrl-C reaches its whole group, as in a terminal)."""

    def __init__(self, argv: list[str], ports: dict[int, int], ready: str, out: Path):
        self.ports, self.out = ports, out
        serving = {f"DLM_SERVING__{PORTS[default].upper()}": str(port) for default, port in ports.items()}
        env = {**os.environ, **serving, "PYTHONPATH": str(ROOT)}
        with open(out, "w") as sink:
            self.process = subprocess.Popen(
                argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 600
        while ready not in self.output():
            assert self.process.poll() is None, f"{argv} exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"{argv} not ready:\n{self.output()}"
            time.sleep(1)
        head, _, rest = self.output().partition(ready)
        self.banner = head + ready + rest.split("\n", 1)[0] + "\n"  # what it printed until it was ready
        self.tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]

    def output(self) -> str:
        return self.out.read_text()

    def interrupt(self, timeout: float = 120) -> int:
        """Ctrl-C in its terminal: SIGINT to its process group."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """kind -> Server, started when an example first needs it: `dlm serve` as the README runs it, its ports moved
    through DLM_SERVING__* (what `dlm serve` reads), and `dlm serve --local`."""
    root, started = tmp_path_factory.mktemp("readme"), {}

    def start(kind: str, source: str) -> Server:
        if kind not in started:
            if kind == "ray":
                ports = {default: free_port() for default in PORTS}
                started[kind] = Server([*DLM, "serve"], ports, "Stop with", root / "ray.out")
            else:
                ports = {50051: free_port()}
                argv = [*DLM, *localize(source, ports).split()[1:]]
                started[kind] = Server(argv, ports, "models loaded: SERVING", root / "local.out")
        return started[kind]

    yield start
    for server in started.values():
        server.close()


@pytest.mark.parametrize("example", SERVED, ids=str)
def test_a_served_example_prints_what_the_readme_shows(example, servers, tmp_path):
    server = servers(example.server, example.source)
    expected = localize(example.expected, server.ports)
    if example.starts_server:
        got = server.banner
    else:
        got = run(example, tmp_path, server.ports)
        for _ in range(30):  # Ray exports metrics every few seconds
            if matches(expected, got) or not example.source.startswith("curl"):
                break
            time.sleep(1)
            got = run(example, tmp_path, server.ports)
    assert matches(expected, got), f"{example}\nREADME shows:\n{expected}\nit printed:\n{got}"


def loopback(address: str) -> bool:
    return address in ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def test_dlm_serve_binds_what_it_configures_to_serving_host(servers):
    server = servers("ray", "dlm serve")
    listening = {}
    for proc in server.tree:
        try:
            sockets = proc.net_connections("inet")
            name = proc.name()
        except psutil.NoSuchProcess:
            continue
        listening |= {(s.laddr.ip, s.laddr.port): name for s in sockets if s.status == psutil.CONN_LISTEN}
    for port in server.ports.values():  # gRPC, HTTP, metrics, dashboard
        addresses = [ip for ip, p in listening if p == port]
        assert addresses and all(loopback(ip) for ip in addresses), (port, addresses)
    # Ray's own ports are loopback too, but for Serve's replica-to-replica gRPC (README, "Ports")
    exposed = {(ip, port): name for (ip, port), name in listening.items() if not loopback(ip)}
    assert exposed and all(name.startswith("ray::ServeReplica") and ip == "::" for (ip, _), name in exposed.items())


def test_each_finished_request_is_one_json_line_in_the_orchestrator_log(servers):
    server = servers("ray", "dlm serve")
    [logs] = [line.split(" ", 2)[1] for line in server.output().splitlines() if line.startswith("Logs: ")]
    ids = [f"readme-log-{i}" for i in range(4)]
    with DlmClient(f"127.0.0.1:{server.ports[50051]}", timeout=120) as client:
        replies = {request_id: client.generate("sort: 42 7 19 88 3 55", request_id=request_id) for request_id in ids}
    orchestrators = sorted(Path(logs).glob("replica_dlm_orchestrator_*.log"))
    assert len(orchestrators) == 2  # a log per replica: serving.replicas.orchestrator in the shipped config
    deadline = time.monotonic() + 10
    while True:  # a request's line is written just after its last chunk leaves (Engine.settle), so it may trail it
        written = [line for log in orchestrators for line in whole_lines(log)]
        lines = [line for line in written if "request_finished" in line]
        records = [json.loads(line.split(" -- ", 1)[1]) for line in lines]  # Serve's prefix, then the JSON object
        ours = [r for r in records if r["request_id"] in ids]
        if len(ours) >= len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sorted(r["request_id"] for r in ours) == ids  # one line each, written as the request ended
    assert all(set(r) == LOG_KEYS | {"event"} for r in ours)
    for record in ours:  # the usage the client got, the EOS counted in both
        reply = replies[record["request_id"]]
        assert record["output_tokens"] == reply.usage.completion_tokens == len(reply.token_ids)
        assert record["finish_reason"] == "eos" and reply.text == "3 7 19 42 55 88"


def test_cpu_per_token_against_dlm_serve_names_where_a_served_token_goes(servers):
    """README, "One machine's cores": `scripts/cpu_per_token.py --target --idle` against `dlm serve`."""
    server = servers("ray", "dlm serve")
    target = f"127.0.0.1:{server.ports[50051]}"
    args = ("--target", target, "--idle", "2", "--concurrency", "2", "--levels", "1")
    idle, loaded = run_script("scripts/cpu_per_token.py", *args).split("served c=2")  # no warm-up line
    [busy] = re.findall(r"served idle: ([\d.]+)% of a core over 2 s", idle)
    shares = [float(share) for share in re.findall(r"^    .+ ([\d.]+)%$", idle, re.M)]
    assert 0 < sum(shares) <= float(busy) + 0.1 and all(shares)  # the busiest processes, with no load
    total, *rows = loaded.splitlines()
    tok_s, cores, ms = map(float, re.findall(r"([\d.]+) (?:tok/s|busy cores|CPU ms a token)", total))
    assert tok_s > 0 and ms == pytest.approx(1000 * cores / tok_s, rel=0.05)
    rows = dict(line.strip().rsplit(None, 1) for line in rows if line.startswith("    "))
    for name in ("ServeReplica:dlm:drafter", "ServeReplica:dlm:guider", "ServeReplica:dlm:orchestrator"):
        assert float(rows[name]) > 0, rows  # each model replica and the orchestrator, by its Ray actor's name
    assert sum(map(float, rows.values())) <= ms + 0.01  # the rows are the busiest of the total's processes


def test_ctrl_c_stops_dlm_serve_quietly(servers):
    server = servers("ray", "dlm serve")
    assert server.interrupt() == 0
    said = server.output()
    assert not [s for s in SPURIOUS if s in said], said
    # Ray's processes end just after `dlm serve` does (one was still running at the check in a clean-clone CI run):
    # each gets a few seconds, and none may stay
    _, alive = psutil.wait_procs(server.tree, timeout=15)
    assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], alive
