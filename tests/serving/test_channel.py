"""The rounds' channel to a replica (services/serving/channel.py): replies find their calls by id whatever their
order, a replica runs its frames and its other work one at a time on one thread, a connection without the replica's
token is closed unanswered, and a replica that dies fails the calls in flight on it with ChannelClosed, at once and
for good."""

import asyncio
import socket
import subprocess
import sys
import threading
import time

import pytest

from services.serving.channel import HEADER, Channel, ChannelClosed, ChannelServer, frame, read_frame


def echo(payload: bytes, session=None) -> bytes:
    return b"echo " + payload


def test_replies_find_their_calls_by_id_in_any_order():
    async def calls():
        async def answer_backwards(reader, writer):
            await read_frame(reader)  # the token
            frames = [await read_frame(reader) for _ in range(4)]
            for call_id, payload in reversed(frames):
                writer.write(frame(call_id, echo(payload)))

        server = await asyncio.start_server(answer_backwards, "127.0.0.1", 0)
        channel = Channel(server.sockets[0].getsockname()[:2], b"token")
        replies = await asyncio.gather(*(channel.call(str(i).encode()) for i in range(4)))
        server.close()
        return replies

    assert asyncio.run(calls()) == [b"echo 0", b"echo 1", b"echo 2", b"echo 3"]


def test_a_replica_runs_its_calls_and_other_work_one_at_a_time_on_one_thread():
    ran = []

    def handle(payload: bytes, session: dict) -> bytes:
        ran.append((threading.current_thread(), payload))
        time.sleep(0.01)
        return echo(payload)

    server = ChannelServer("127.0.0.1", handle, dict)

    async def calls():
        channel = Channel(server.address, server.token)
        out = asyncio.gather(*(channel.call(str(i).encode()) for i in range(5)))
        other = asyncio.wrap_future(server.submit(lambda: ran.append((threading.current_thread(), b"release"))))
        return await out, await other

    replies, _ = asyncio.run(calls())
    assert replies == [f"echo {i}".encode() for i in range(5)]
    assert len({thread for thread, _ in ran}) == 1 and len(ran) == 6
    assert [payload for _, payload in ran if payload != b"release"] == [str(i).encode() for i in range(5)]


def test_work_submitted_to_a_replicas_thread_brings_its_exception_back():
    server = ChannelServer("127.0.0.1", echo, dict)

    def fails():
        raise KeyError("no such request")

    with pytest.raises(KeyError, match="no such request"):
        server.submit(fails).result(timeout=10)


def test_a_connection_without_the_token_is_closed_unanswered():
    ran = []
    server = ChannelServer("127.0.0.1", lambda payload, _: ran.append(payload), dict)
    with socket.create_connection(server.address) as sock:
        sock.sendall(frame(0, b"not the token") + frame(1, b"payload"))
        sock.settimeout(10)
        assert sock.recv(HEADER.size) == b""  # closed by the replica
    assert ran == []


REPLICA = """
import time
from services.serving.channel import ChannelServer
server = ChannelServer("127.0.0.1", lambda payload, _: time.sleep(int(payload)) or payload, dict)
print(server.address[1], server.token.hex(), flush=True)
time.sleep(3600)
"""


def test_a_replica_that_dies_fails_the_calls_in_flight_and_every_later_one():
    replica = subprocess.Popen([sys.executable, "-c", REPLICA], stdout=subprocess.PIPE, text=True)
    port, token = replica.stdout.readline().split()
    address, token = ("127.0.0.1", int(port)), bytes.fromhex(token)

    async def calls():
        channel = Channel(address, token)
        assert await channel.call(b"0") == b"0"
        in_flight = asyncio.ensure_future(channel.call(b"100"))
        await asyncio.sleep(0.2)
        replica.kill()
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(in_flight, 30)
        with pytest.raises(ChannelClosed):
            await channel.call(b"0")
        channel.post(b"0")  # a release to a dead replica is lost with it, quietly
        await asyncio.sleep(0)

    try:
        asyncio.run(calls())
    finally:
        replica.kill()
        replica.wait()
