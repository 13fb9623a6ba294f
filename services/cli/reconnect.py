"""A GenerateStream that survives its server: when the stream breaks (UNAVAILABLE, or it ends with no Complete) the
client calls again with `resume` (the request id, the token ids and characters it received), with backoff, for up to
resume_timeout seconds after each break: long enough for the dead orchestrator's lease to lapse and a live one (or
the one Serve restarts) to adopt the request. The server sends only what follows what the client has, so the caller
sees one uninterrupted stream. NOT_FOUND, INVALID_ARGUMENT and every other status are not retried."""

import time
from collections.abc import Callable, Iterator

import grpc

from services.serving.wire import REQUEST_ID_HEADER, pb

BACKOFF_S = (0.05, 1.0)  # first and longest wait between reconnects


class StreamBroken(Exception):
    """The stream ended without a Complete."""


def resuming(call: Callable, request, resume_timeout: float, held: bool = False) -> Iterator:
    """call(request) -> a GenerateStream call; yields its events (Chunk, Spans, Complete) across reconnects. request
    names its request_id. A call breaks into a resume only once the server held the request (`held`: its headers
    named it, or a message came), so a request the server refused (models loading, index down) is not retried. A
    resume answered NOT_FOUND before any token came is sent anew (the server died before recording it)."""
    tokens = chars = 0
    give_up, wait = None, BACKOFF_S[0]
    while True:
        stream = call(with_resume(request, tokens, chars) if held else request)
        try:
            held = held or holds(stream)
            for message in stream:
                held, give_up, wait = True, None, BACKOFF_S[0]
                for event in events(message):
                    if isinstance(event, pb.Chunk):
                        tokens, chars = tokens + len(event.token_ids), chars + len(event.text)
                    yield event
                if message.HasField("complete"):
                    return
            raise StreamBroken(f"the stream of request {request.request_id} ended without completing")
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND and held and not tokens:
                held = False  # its orchestrator died before it recorded the request: nothing was seen, send it anew
                continue
            if e.code() != grpc.StatusCode.UNAVAILABLE or not held:
                raise
            last = e
        except StreamBroken as e:
            last = e
        finally:
            stream.cancel()  # a no-op once the stream completed
        give_up = give_up or time.monotonic() + resume_timeout
        if time.monotonic() + wait > give_up:
            raise last
        time.sleep(wait)
        wait = min(2 * wait, BACKOFF_S[1])


def events(message) -> list:
    """A stream message's event; a Complete that carries the last Chunk (last_chunk_in_complete) as that Chunk, then
    the Complete without it."""
    event = getattr(message, message.WhichOneof("event"))
    if not isinstance(event, pb.Complete) or not event.HasField("last_chunk"):
        return [event]
    last = pb.Chunk()
    last.CopyFrom(event.last_chunk)
    event.ClearField("last_chunk")
    return [last, event]


def holds(call) -> bool:
    """The call's headers name its request: the server holds it."""
    return any(key == REQUEST_ID_HEADER for key, _ in call.initial_metadata() or ())


def with_resume(request, tokens: int, chars: int):
    resumed = pb.GenerateRequest()
    resumed.CopyFrom(request)
    resumed.resume.CopyFrom(pb.Resume(tokens_received=tokens, text_received=chars))
    return resumed
