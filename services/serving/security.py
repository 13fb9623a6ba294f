"""gRPC security from serving config: TLS (optionally mTLS) credentials and bearer-token auth, server and client side.

Secrets never come from the config's values: it names files (serving.api_key_file, serving.tls_*_file), and the
token may instead come from the DLM_API_KEY environment variable."""

import hmac
import os
from collections.abc import Mapping

import grpc
from grpc_health.v1 import health

from services.common.config import API_KEY_ENV, ServingConfig

OPEN_SERVICES = (health.SERVICE_NAME,)  # answer without a token: load balancers and probes carry none


def read_secret(path: str) -> str:
    with open(path) as f:
        secret = f.read().strip()
    if not secret:
        raise ValueError(f"{path} is empty")
    return secret


def api_key(path: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token from the file, else DLM_API_KEY; None: no auth."""
    if path:
        return read_secret(path)
    return (os.environ if environ is None else environ).get(API_KEY_ENV) or None


def server_credentials(serving: ServingConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the server's port; None: plaintext. With tls_client_ca_file clients must present a
    certificate that CA signed (mTLS)."""
    if not serving.tls_cert_file:
        return None
    pair = [(read_bytes(serving.tls_key_file), read_bytes(serving.tls_cert_file))]
    if not serving.tls_client_ca_file:
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(pair, read_bytes(serving.tls_client_ca_file), require_client_auth=True)


def channel(target: str, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None):
    """A client channel: TLS when ca_file is given (trusting that CA; cert_file + key_file for mTLS), else plaintext."""
    if ca_file is None:
        if cert_file:
            raise ValueError("a client certificate needs TLS: give the server's CA too")
        return grpc.insecure_channel(target)
    key, cert = (read_bytes(key_file), read_bytes(cert_file)) if cert_file else (None, None)
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(read_bytes(ca_file), key, cert))


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries the token (none without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class TokenAuth(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for a call without `authorization: Bearer <token>`; the OPEN_SERVICES answer anyone."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        service = details.method.lstrip("/").split("/", 1)[0]
        sent = dict(details.invocation_metadata or ()).get("authorization", "")
        if service in OPEN_SERVICES or hmac.compare_digest(self.expected, sent.encode()):
            return await continuation(details)
        handler = await continuation(details)
        return None if handler is None else refusal(handler)


def refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as handler that aborts UNAUTHENTICATED without reading the request."""

    async def refuse(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token (authorization header)")

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[handler.request_streaming, handler.response_streaming]
    return make(refuse, handler.request_deserializer, handler.response_serializer)
