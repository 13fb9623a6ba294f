"""free_port, which every served test and `dlm serve`'s own redis-server take their ports from: a port that no
outgoing connection can hold, since the kernel gives those ports from its ephemeral range only."""

import socket

from services.serving.redis_process import FIRST_PORT, ephemeral_start, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_free():
    ports = {free_port() for _ in range(20)}
    assert all(FIRST_PORT <= port < ephemeral_start() for port in ports)
    assert len(ports) > 1  # chosen at random: two servers that start together rarely meet
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_held_port_is_never_chosen(monkeypatch):
    with socket.socket() as held, socket.socket() as spare:
        held.bind(("127.0.0.1", 0))
        spare.bind(("127.0.0.1", 0))
        taken, free = held.getsockname()[1], spare.getsockname()[1]
        spare.close()
        monkeypatch.setattr("random.sample", lambda population, k: iter([taken, free]))
        assert free_port() == free


def test_a_kernel_with_no_room_below_its_range_gets_the_kernels_choice(monkeypatch):
    monkeypatch.setattr("services.serving.redis_process.ephemeral_start", lambda: FIRST_PORT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
