"""The rounds' channel to a replica (services/serving/channel.py): calls in flight at once each get their own reply,
a connection without the replica's token is closed unanswered, and a replica that dies fails the calls in flight on
it with ChannelClosed, at once and for good."""

import asyncio
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.serving.channel import HEADER, Channel, ChannelClosed, ChannelServer, frame


def slow_echo(payload: bytes) -> bytes:
    """Sleeps as long as the payload says (ms), so that replies come back out of order."""
    time.sleep(int(payload) / 1000)
    return b"echo " + payload


def test_calls_in_flight_at_once_each_get_their_own_reply():
    server = ChannelServer("127.0.0.1", slow_echo, ThreadPoolExecutor(4))

    async def calls():
        channel = Channel(server.address, server.token)
        return await asyncio.gather(*(channel.call(str(ms).encode()) for ms in (80, 10, 40, 0)))

    assert asyncio.run(calls()) == [b"echo 80", b"echo 10", b"echo 40", b"echo 0"]


def test_a_connection_without_the_token_is_closed_unanswered():
    ran = []
    server = ChannelServer("127.0.0.1", ran.append, ThreadPoolExecutor(1))
    with socket.create_connection(server.address) as sock:
        sock.sendall(frame(0, b"not the token") + frame(1, b"payload"))
        sock.settimeout(10)
        assert sock.recv(HEADER.size) == b""  # closed by the replica
    assert ran == []


REPLICA = """
import sys, time
from concurrent.futures import ThreadPoolExecutor
from services.serving.channel import ChannelServer
from tests.serving.test_channel import slow_echo
server = ChannelServer("127.0.0.1", slow_echo, ThreadPoolExecutor(1))
print(server.address[1], server.token.hex(), flush=True)
time.sleep(3600)
"""


def test_a_replica_that_dies_fails_the_calls_in_flight_and_every_later_one():
    replica = subprocess.Popen([sys.executable, "-c", REPLICA], stdout=subprocess.PIPE, text=True)
    port, token = replica.stdout.readline().split()
    address, token = ("127.0.0.1", int(port)), bytes.fromhex(token)

    async def calls():
        channel = Channel(address, token)
        assert await channel.call(b"0") == b"echo 0"
        in_flight = asyncio.ensure_future(channel.call(b"10000"))
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
