"""scripts/cpu_per_token.py, which the README cites for where a served token's CPU goes: its in-process form runs on
the shipped zoo, and its served form's accounting (/proc) finds the CPU this process burns, under its own name."""

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from tests.readme import ROOT, run_script
from tests.zoo import needs_zoo

sys.path.insert(0, str(ROOT / "scripts"))
import cpu_per_token  # noqa: E402


def test_the_process_accounting_names_this_process_and_counts_its_cpu():
    before = cpu_per_token.processes()
    start = time.process_time()
    while time.process_time() - start < 0.3:  # burn 0.3 s of CPU
        pass
    after = cpu_per_token.processes()
    seconds, name = after[os.getpid()]
    assert name == "this client"
    assert 0.25 <= seconds - before[os.getpid()][0] <= 1.0  # clock ticks are 10 ms


def test_idle_counts_the_cpu_every_process_spends_while_this_one_waits():
    # another process burning CPU under a name of its own (argv[0]), from half a second before the window on
    burner = subprocess.Popen(["bash", "-c", f"exec -a dlm-burner {sys.executable} -c 'while True: pass'"])
    try:
        time.sleep(0.5)
        by_process = cpu_per_token.idle(1.0)
    finally:
        burner.kill()
        burner.wait()
    assert 0.2 <= by_process["dlm-burner"] <= 1.15  # its second in the window (less on a busy machine), not before
    assert all(seconds > 0 for seconds in by_process.values())  # only processes that spent some


def test_idle_needs_a_server():
    out = subprocess.run(
        [sys.executable, "scripts/cpu_per_token.py", "--idle", "1"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 2 and "--idle measures a server: give --target" in out.stderr


@pytest.mark.slow
@needs_zoo
def test_in_process_it_reports_tok_s_busy_cores_and_cpu_per_token():
    out = run_script("scripts/cpu_per_token.py", "--concurrency", "2", "--levels", "1")
    lines = [line for line in out.splitlines() if line.startswith("in process")]
    assert len(lines) == 1  # the warm-up level is not reported
    tok_s, cores, ms = map(float, re.findall(r"([\d.]+) (?:tok/s|busy cores|CPU ms a token)", lines[0]))
    assert tok_s > 0 and 0 < cores <= os.cpu_count() + 0.1
    assert ms == pytest.approx(1000 * cores / tok_s, rel=0.05)  # CPU per token = busy cores / tok/s
    assert 1 <= float(re.search(r"([\d.]+) tokens a request", lines[0])[1]) <= 48  # the bench's max_new_tokens
    rows = dict(line.strip().rsplit(None, 1) for line in out.splitlines() if line.startswith("    "))
    assert set(rows) == {"the engine (its thread)", "the forwards"} and all(float(v) > 0 for v in rows.values())
    assert sum(map(float, rows.values())) == pytest.approx(ms, abs=0.002)  # the threads make up the total


def test_threads_count_each_thread_of_this_process_apart():
    burnt, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def burn() -> None:  # 0.3 s of CPU on a thread of its own, which then waits (a thread that ended has no entry)
        tids.append(threading.get_native_id())
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        burnt.set()
        done.wait(10)

    before = cpu_per_token.threads()
    worker = threading.Thread(target=burn)
    worker.start()
    try:
        assert burnt.wait(10)
        after = cpu_per_token.threads()
    finally:
        done.set()
        worker.join()
    [tid] = tids
    assert tid not in before and 0.25 <= after[tid] <= 1.0  # clock ticks are 10 ms
    assert after[threading.get_native_id()] - before[threading.get_native_id()] < 0.2  # this one waited
