"""The per-round calls' own channel between an orchestrator and a model replica: one TCP connection per orchestrator
process and replica, carrying length-prefixed frames, with every call in flight on it at once (the micro-batches'
engines share it). Serve still places, scales, restarts and health-checks the replica and hands out its address
(services/serving/direct.py); only the rounds' bytes take this path, as vLLM's engine core takes its requests over
a socket of its own. A no-op round trip costs a tenth of a Ray actor call's (scripts/transport_rtt.py).

A frame is a header (payload length, call id) and the payload. A connection's first frame carries the replica's
token, which only Serve hands out: a frame's payload is a pickle, which nothing else may send. A replica that dies
closes its connections, and every call in flight on them raises ChannelClosed, a ConnectionError: the remote
executor moves those requests as it does for a dead actor.
"""

import asyncio
import itertools
import secrets
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TypeVar

HEADER = struct.Struct("!IQ")  # payload length, call id
NO_REPLY = 0  # the call id of a frame that wants no reply (releases)
T = TypeVar("T")
S = TypeVar("S")


class ChannelClosed(ConnectionError):
    """The replica's end closed: it died, or the connection broke."""


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    try:
        size, call_id = HEADER.unpack(await reader.readexactly(HEADER.size))
        return call_id, await reader.readexactly(size)
    except (asyncio.IncompleteReadError, OSError) as e:
        raise ChannelClosed(repr(e)) from e


def frame(call_id: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), call_id) + payload


class ChannelServer(Executor):
    """A replica's end, and its host's one thread: an event loop on a thread of its own accepts connections and runs
    `handle` on each frame's payload right there, with the connection's session (made by `session` when it opens:
    what the connection's frames share, services/serving/request_sync.py), which returns the reply's payload. The
    host's other work (a release through Serve) comes to the same thread through `submit`, so that nothing touches the
    host's caches at once. Handing each frame to another thread cost two thread wake-ups a call."""

    def __init__(self, ip: str, handle: Callable[[bytes, S], bytes], session: Callable[[], S]):
        self.handle, self.session = handle, session
        self.token = secrets.token_bytes(16)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self.serve, args=(ip, started), name="dlm-host", daemon=True).start()
        started.wait()

    def serve(self, ip: str, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self.connection, ip, 0))
        self.address = (ip, server.sockets[0].getsockname()[1])
        started.set()
        self.loop.run_forever()

    def submit(self, fn: Callable[..., T], /, *args) -> Future[T]:
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as e:
                done.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return done

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            _, token = await read_frame(reader)
            if not secrets.compare_digest(token, self.token):
                return
            session = self.session()
            while True:
                call_id, payload = await read_frame(reader)
                reply = self.handle(payload, session)  # blocks the loop: the host runs one call at a time anyway
                if call_id != NO_REPLY:
                    writer.write(frame(call_id, reply))
        except ChannelClosed:
            pass
        finally:
            writer.close()


class Channel:
    """An orchestrator's end of one replica's channel, connected on first use. Closed for good once it breaks: the
    caller asks Serve for the replica's address again (direct.py)."""

    def __init__(self, address: tuple[str, int], token: bytes, session: object = None):
        self.address, self.token = address, token
        self.session = session  # what the caller keeps of this connection, as ChannelServer's session at the other end
        self.ids = itertools.count(NO_REPLY + 1)
        self.pending: dict[int, asyncio.Future[bytes]] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.connecting: asyncio.Task | None = None
        self.closed: ChannelClosed | None = None

    @property
    def connected(self) -> bool:
        """Connected and not broken: `request` may send on it."""
        return self.writer is not None and self.closed is None

    async def call(self, payload: bytes) -> bytes:
        """payload -> the reply's payload, connecting first where needed."""
        await self.ready()
        return await self.request(payload)

    async def ready(self) -> None:
        """Connected, connecting first where needed: `request` may send."""
        await self.connect()
        if self.closed is not None:  # broke while connecting: nothing would answer
            raise self.closed

    def request(self, payload: bytes) -> asyncio.Future[bytes]:
        """On an open channel: the call's frame, written before this returns -> the future of its reply's payload."""
        call_id = next(self.ids)
        self.pending[call_id] = reply = asyncio.get_running_loop().create_future()
        reply.add_done_callback(lambda _: self.pending.pop(call_id, None))  # answered, failed, or given up
        self.writer.write(frame(call_id, payload))
        return reply

    def post(self, payload: bytes) -> None:
        """A call that wants no reply, sent without waiting; lost with the replica, whose state goes with it."""
        asyncio.ensure_future(self.send(payload))

    async def send(self, payload: bytes) -> None:
        try:
            (await self.connect()).write(frame(NO_REPLY, payload))
        except ChannelClosed:
            pass

    async def connect(self) -> asyncio.StreamWriter:
        if self.closed is not None:
            raise self.closed
        if self.connecting is None:
            self.connecting = asyncio.ensure_future(self.open())
        return await asyncio.shield(self.connecting)

    async def open(self) -> asyncio.StreamWriter:
        try:
            reader, writer = await asyncio.open_connection(*self.address)
        except OSError as e:
            self.closed = ChannelClosed(f"channel to {self.address}: {e!r}")
            raise self.closed from e
        writer.write(frame(NO_REPLY, self.token))
        self.reading = asyncio.ensure_future(self.read(reader))
        self.writer = writer
        return writer

    async def read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                call_id, payload = await read_frame(reader)
                reply = self.pending.get(call_id)
                if reply is not None and not reply.done():
                    reply.set_result(payload)
        except ChannelClosed as e:
            self.closed = ChannelClosed(f"channel to {self.address} closed: {e}")
            for reply in self.pending.values():
                if not reply.done():
                    reply.set_exception(self.closed)
