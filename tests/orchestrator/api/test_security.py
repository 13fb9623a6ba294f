"""TLS, mTLS and bearer tokens on the gRPC server over loopback, and the token on the OpenAI HTTP API (uvicorn)."""

import datetime
import ipaddress
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.cli.client import DlmClient
from services.orchestrator.api.frontend import Frontend
from services.orchestrator.engine.engine import Engine
from services.serving.redis_process import free_port
from services.serving.wire import SERVICE, pb
from tests.orchestrator.api.test_server import PROMPT, Harness

TOKEN = "s3cret-token"


def name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def issue(subject: str, key, issuer_name: x509.Name, issuer_key, ca: bool, usage=None, sans=()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    """PEM files: a CA, a server certificate for localhost / 127.0.0.1 and a client certificate it signed, a second
    CA that signed neither, and the token file."""
    out = tmp_path_factory.mktemp("pki")
    files = {}

    def write(label: str, cert: x509.Certificate, key) -> None:
        files[label] = str(out / f"{label}.pem")
        (out / f"{label}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{label}_key"] = str(out / f"{label}.key")
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        (out / f"{label}.key").write_bytes(pem)

    ca_key, other_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(4))
    ca = issue("test ca", ca_key, name("test ca"), ca_key, ca=True)
    write("ca", ca, ca_key)
    write("other_ca", issue("other ca", other_key, name("other ca"), other_key, ca=True), other_key)
    sans = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    server = issue("localhost", server_key, ca.subject, ca_key, False, ExtendedKeyUsageOID.SERVER_AUTH, sans)
    write("server", server, server_key)
    write("client", issue("client", client_key, ca.subject, ca_key, False, ExtendedKeyUsageOID.CLIENT_AUTH), client_key)
    files["token"] = str(out / "token")
    (out / "token").write_text(TOKEN + "\n")  # a trailing newline, as `echo` writes it
    return files


def harness(engine, serving: dict, **client) -> Harness:
    config = replace(engine.config, serving=replace(engine.config.serving, **serving))
    served = Harness(Frontend(Engine(config, executor=engine.executor)), **client)
    served.client.wait_ready()
    return served


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code()


def generates(client: DlmClient) -> bool:
    return client.generate(PROMPT, strategy="streaming", max_new_tokens=2).usage.completion_tokens > 0


@pytest.fixture(scope="module")
def tls(engine, pki):
    serving = dict(tls_cert_file=pki["server"], tls_key_file=pki["server_key"], api_key_file=pki["token"])
    served = harness(engine, serving, api_key=TOKEN, tls_ca=pki["ca"])
    yield served
    served.close()


def test_tls_client_with_the_ca_and_token_decodes(tls):
    assert generates(tls.client)
    assert [e for e in tls.client.stream(PROMPT, strategy="streaming", max_new_tokens=2)][-1].usage.completion_tokens


def test_plaintext_client_and_client_of_another_ca_cannot_connect(tls, pki):
    for client in (
        DlmClient(f"127.0.0.1:{tls.port}", timeout=5, api_key=TOKEN),
        DlmClient(f"127.0.0.1:{tls.port}", timeout=5, api_key=TOKEN, tls_ca=pki["other_ca"]),
    ):
        with client:
            assert code_of(client.health) == grpc.StatusCode.UNAVAILABLE
            assert code_of(lambda c=client: c.generate(PROMPT, max_new_tokens=2)) == grpc.StatusCode.UNAVAILABLE


def test_no_or_wrong_token_is_unauthenticated_while_health_answers(tls, pki):
    for token in (None, "wrong", TOKEN + "x", TOKEN[:-1]):
        with DlmClient(f"localhost:{tls.port}", timeout=10, api_key=token, tls_ca=pki["ca"]) as client:
            assert client.health() == client.health("") == "SERVING"
            assert code_of(lambda c=client: c.generate(PROMPT, max_new_tokens=2)) == grpc.StatusCode.UNAUTHENTICATED
            stream = lambda c=client: list(c.stream(PROMPT, max_new_tokens=2))  # noqa: E731
            assert code_of(stream) == grpc.StatusCode.UNAUTHENTICATED
            assert code_of(client.model_info) == grpc.StatusCode.UNAUTHENTICATED
            assert code_of(lambda c=client: c.abort("r")) == grpc.StatusCode.UNAUTHENTICATED
    assert tls.backend.live() == []


def test_the_replica_health_probe_reaches_a_tls_server_in_plaintext_on_its_socket(tls):
    target = tls.server.local_target("0.0.0.0")
    assert target.startswith("unix:")
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        generate = pb.GenerateRequest(text=PROMPT, max_new_tokens=2)
        with pytest.raises(grpc.RpcError) as err:  # the socket is plaintext, not tokenless
            channel.unary_unary(f"/{SERVICE}/Generate", pb.GenerateRequest.SerializeToString)(generate, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_mtls_refuses_a_client_without_a_certificate(engine, pki):
    serving = dict(tls_cert_file=pki["server"], tls_key_file=pki["server_key"], tls_client_ca_file=pki["ca"])
    served = harness(engine, serving, tls_ca=pki["ca"], tls_cert=pki["client"], tls_key=pki["client_key"])
    try:
        assert generates(served.client)
        with DlmClient(f"127.0.0.1:{served.port}", timeout=5, tls_ca=pki["ca"]) as anonymous:
            assert code_of(anonymous.health) == grpc.StatusCode.UNAVAILABLE
        # a certificate the client CA did not sign is refused too (the server's own CA bundle is not trusted)
        stranger = DlmClient(
            f"127.0.0.1:{served.port}",
            timeout=5,
            tls_ca=pki["ca"],
            tls_cert=pki["other_ca"],
            tls_key=pki["other_ca_key"],
        )
        with stranger:
            assert code_of(stranger.health) == grpc.StatusCode.UNAVAILABLE
    finally:
        served.close()
    assert not os.path.exists(os.path.dirname(served.server.socket))  # the health socket's directory went with it


def test_token_from_the_environment_on_a_plaintext_server(engine, monkeypatch):
    monkeypatch.setenv("DLM_API_KEY", TOKEN)
    served = harness(engine, {}, api_key=TOKEN)
    try:
        assert generates(served.client)
        with DlmClient(f"127.0.0.1:{served.port}", timeout=10) as anonymous:
            assert anonymous.health() == "SERVING"
            assert code_of(lambda: anonymous.generate(PROMPT, max_new_tokens=2)) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        served.close()


def test_no_token_configured_means_open(engine, monkeypatch):
    monkeypatch.delenv("DLM_API_KEY", raising=False)
    served = harness(engine, {})
    try:
        assert generates(served.client)
    finally:
        served.close()


def http(url: str, token: str | None = None, body: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as e:
        return e.code


def test_openai_api_takes_the_same_bearer_token(engine):
    uvicorn = pytest.importorskip("uvicorn")
    from services.orchestrator.api.openai_api import api, attach

    backend = Frontend(Engine(engine.config, executor=engine.executor))
    backend.ready = True  # the routes checked here read model info only; nothing decodes
    attach(backend, engine.config.serving.limits, TOKEN)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        assert http(f"{base}/health") == 200
        assert http(f"{base}/v1/models") == http(f"{base}/v1/models", "wrong") == 401
        assert http(f"{base}/v1/models", TOKEN) == 200
        body = b'{"model": "dlm", "prompt": "hi", "max_tokens": 1}'
        assert http(f"{base}/v1/completions", None, body) == 401
        assert http(f"{base}/v1/chat/completions", "wrong", b'{"model": "dlm", "messages": []}') == 401
    finally:
        server.should_exit = True
        thread.join(5)
        attach(backend, engine.config.serving.limits)
