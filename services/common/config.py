"""Engine configuration: which model directory plays which role, device and dtype; read from one YAML file, under
`DLM_` environment variables (DLM_SERVING__REDIS_URL, DLM_STRATEGY); unknown keys are errors. Secrets are never
config values: the config names files that hold them, or they come from the variables in SECRET_ENV."""

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

import yaml

from services.common.config_keys import check_fields, check_keys, env_overrides, given, merge

ROLES = ("drafter", "drafter_bidirectional", "guider", "ar", "filter", "filter_bidirectional")
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "configs", "dlm.yaml")
API_KEY_ENV = "DLM_API_KEY"  # the bearer token clients must send, when serving.api_key_file is not set
REDIS_PASSWORD_ENV = "DLM_REDIS_PASSWORD"  # the cache index's Redis password (not REDIS_PASSWORD: KubeRay sets that)
SECRET_ENV = (API_KEY_ENV, REDIS_PASSWORD_ENV)  # DLM_ variables that are not config keys
# request ids name index keys, log lines and metrics: letters, digits and . _ - only (no ':' or spaces)
REQUEST_ID = re.compile(r"[A-Za-z0-9._-]+")


class LimitExceeded(ValueError):
    """A request breaks serving.limits; `field` names the request field (the wire's own name)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(slots=True)
class Limits:
    """What one request may ask of the server (serving.limits)."""

    max_new_tokens: int = 1024
    max_stop_sequences: int = 8
    max_stop_length: int = 64
    max_request_id_length: int = 128
    max_logprobs: int = 20  # top alternatives a request may ask per token

    def __post_init__(self):
        if min(asdict(self).values()) < 1:
            raise ValueError(f"serving.limits must all be >= 1, got {asdict(self)}")

    def check(
        self,
        max_new_tokens: int | None,
        stop: list[str],
        logprobs: int | None,
        request_id: str = "",
        max_tokens_field: str = "max_new_tokens",
    ) -> None:
        """The one check of a request against the limits, whatever its transport (gRPC, the OpenAI API)."""
        if max_new_tokens is not None and max_new_tokens > self.max_new_tokens:
            message = f"{max_tokens_field} {max_new_tokens} exceeds the server limit of {self.max_new_tokens}"
            raise LimitExceeded(max_tokens_field, message)
        if len(stop) > self.max_stop_sequences:
            raise LimitExceeded("stop", f"stop: at most {self.max_stop_sequences} sequences, got {len(stop)}")
        for s in stop:
            if not 0 < len(s) <= self.max_stop_length:
                message = f"stop sequences must have 1 to {self.max_stop_length} characters, got {len(s)}"
                raise LimitExceeded("stop", message)
        if len(request_id) > self.max_request_id_length:
            raise LimitExceeded("request_id", f"request_id is longer than {self.max_request_id_length} characters")
        if request_id and not REQUEST_ID.fullmatch(request_id):
            raise LimitExceeded("request_id", "request_id may hold only letters, digits, '.', '_' and '-'")
        if logprobs is not None and logprobs > self.max_logprobs:
            message = f"logprobs {logprobs} exceeds the server limit of {self.max_logprobs}"
            raise LimitExceeded("logprobs", message)


@dataclass(slots=True)
class ServingConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    http_port: int = 8000  # the Serve HTTP proxy: the OpenAI-compatible API on host:http_port/v1
    num_gpus: float = 0  # per model deployment: 1 on a GPU cluster gives each model its own GPU
    max_concurrency: int = 64  # requests a step advances at once (vLLM's max_num_seqs); the rest wait
    # served engines over the same replicas, stepping apart so that their stages overlap; None: 2 over separate
    # deployments, 1 colocated, whose replica runs one call at a time (two engines only halved its batches: served c=1
    # 319 and 331 against 386 and 443 tok/s, c=16 890 and 714 against 914 and 1105, taking turns)
    micro_batches: int | None = None
    redis_url: str | None = None  # the cache index; None: `dlm serve` starts a redis-server on loopback
    # torch threads per model replica on CPU, set on the channel's thread that runs its forwards (serving/replica.py;
    # Ray sets a worker's OMP_NUM_THREADS to its reserved CPUs, so set elsewhere they never reached it). A team of 2
    # loses on 2 cores, its threads sleeping between ops (the replicas' OMP_WAIT_POLICY=PASSIVE, cluster/app.py):
    # served pipeline c=1 289, 266 and 233 against 318, 297 and 262 tok/s, c=16 820, 809 and 721 against 830, 873
    # and 767, taking turns. With 1 each, the drafter and the guider compute at once on different micro-batches
    replica_threads: int = 1
    # One deployment, `models`, whose replicas run every model (drafter, guider, AR baseline, filter), on CPU with a
    # thread per core: for models that share one device, in one process rather than one each. Off: one deployment per
    # model, each on a device of its own (num_gpus 1 on a GPU cluster), and on a CPU box or one shared GPU, where
    # colocated measured below it (README, "Colocated")
    colocate: bool = False
    kv_budget_tokens: int = 65536  # per replica holding KV; a request counts once on a colocated one
    max_queue: int = 64  # requests waiting for KV budget before RESOURCE_EXHAUSTED
    request_ttl_s: int = 600  # cache-index entries of abandoned requests expire
    lease_s: float = 2.0  # an orchestrator's lease in the index: its requests are adopted this long after it died
    # deployment -> replicas (orchestrator, drafter, guider, ar, filter; models when colocated); 1 by default.
    # Orchestrator replicas share the gRPC port (SO_REUSEPORT), the OpenAI API (the Serve proxy), the model replicas
    # and the cache index's ledger
    replicas: dict[str, int] = field(default_factory=dict)
    # deployment -> custom Ray resources each of its replicas needs, e.g. {"drafter": {"gpu_node_a": 1}}: which node
    # (which machine) runs it, where the nodes were started with those resources (`ray start --resources`)
    resources: dict[str, dict[str, float]] = field(default_factory=dict)
    call_timeout_s: float = 30.0  # a model call that takes longer counts its replica as lost: its requests move
    resume_timeout_s: float = 60.0  # how long a request whose replica was lost waits for another before UNAVAILABLE
    limits: Limits = field(default_factory=Limits)
    # secrets by file path (or the SECRET_ENV variables), never inline: the config may sit in a repo or a ConfigMap
    api_key_file: str | None = None  # bearer token for gRPC and the OpenAI API (vLLM's --api-key); else DLM_API_KEY
    tls_cert_file: str | None = None  # gRPC serves TLS with this PEM certificate chain and tls_key_file
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None  # mTLS: clients must present a certificate this CA signed
    metrics_export_port: int = 8080  # Ray's Prometheus endpoint (`dlm serve`; KubeRay's convention)
    dashboard_port: int = 8265  # the Ray dashboard of `dlm serve` (Ray's default)
    log_level: str = "INFO"  # the orchestrator's: INFO logs one JSON line per finished request

    def __post_init__(self):
        if isinstance(self.limits, Mapping):
            check_fields(Limits, self.limits, "serving.limits")
            self.limits = Limits(**self.limits)
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("serving.tls_cert_file and serving.tls_key_file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("serving.tls_client_ca_file (mTLS) needs serving.tls_cert_file and tls_key_file")
        if not 0 < self.port < 65536:
            raise ValueError(f"serving.port must be in (0, 65536), got {self.port}")
        counts = (self.max_concurrency, self.engines, self.kv_budget_tokens)
        if min(counts) < 1 or min(self.num_gpus, self.max_queue) < 0:
            raise ValueError(
                "serving: num_gpus >= 0, max_queue >= 0, and >= 1: max_concurrency, micro_batches, kv_budget_tokens"
            )
        deployments = ("orchestrator", "drafter", "guider", "ar", "filter", "models")
        bad = {d: n for d, n in self.replicas.items() if d not in deployments or not isinstance(n, int) or n < 1}
        if bad:
            raise ValueError(f"serving.replicas: deployment -> count >= 1 for {deployments}, got {bad}")
        bad = {
            d: r
            for d, r in self.resources.items()
            if d not in deployments
            or not isinstance(r, Mapping)
            or not all(isinstance(v, int | float) and v > 0 for v in r.values())
        }
        if bad:
            raise ValueError(f"serving.resources: deployment -> {{resource: amount > 0}} for {deployments}, got {bad}")
        if min(self.call_timeout_s, self.resume_timeout_s) <= 0:
            raise ValueError("serving.call_timeout_s and serving.resume_timeout_s must be > 0")

    @property
    def engines(self) -> int:
        """The orchestrator's engines: micro_batches, or its default for the layout."""
        return self.micro_batches if self.micro_batches is not None else 1 if self.colocate else 2


@dataclass(slots=True)
class EngineConfig:
    models: dict[str, str] = field(default_factory=dict)  # role -> local directory
    device: str = "cpu"
    dtype: str = "float32"
    cpu_kernels: bool = True  # float32 on the CPU: the decoder's linears, norms, attention and logit maths in C++
    chat_template: bool = True  # wrap prompts with the tokenizer's chat template when it has one
    threads: int | None = None  # torch intra-op threads of in-process forwards; None: torch's default (one per core)
    strategy: str = "pipeline"
    strategies: dict[str, dict] = field(default_factory=dict)  # per-strategy parameter overrides
    max_new_tokens: int = 128
    serving: ServingConfig = field(default_factory=ServingConfig)

    def __post_init__(self):
        if isinstance(self.serving, Mapping):
            check_fields(ServingConfig, self.serving, "serving")
            self.serving = ServingConfig(**self.serving)
        check_keys(self.models, {role: f"models.{role}" for role in ROLES}, "models")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be cpu or cuda[:N], got {self.device!r}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    def path(self, role: str) -> str:
        if role not in self.models:
            raise ValueError(f"no model configured for role {role!r} (config models.{role})")
        return self.models[role]

    @classmethod
    def from_dict(cls, values: Mapping) -> "EngineConfig":
        """The engine section as a dict (e.g. `asdict(config)`); unknown keys raise."""
        check_fields(cls, values, "")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str = DEFAULT_CONFIG, environ: Mapping[str, str] | None = None, **overrides):
        """The file's engine section, then DLM_ variables of environ (default os.environ), then the overrides that
        are not None (nested as dicts: serving={"port": 8000}). Model paths are relative to the file."""
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        if "engine" in raw:
            hints = {"engine": "engine", **{f.name: f"engine.{f.name}" for f in fields(cls)}}
            check_keys(raw, hints)  # `strateg: slot` beside `engine:` names engine.strategy
        engine = dict(raw.get("engine", raw))
        base = os.path.dirname(os.path.abspath(path))
        engine["models"] = {r: os.path.normpath(os.path.join(base, p)) for r, p in engine.get("models", {}).items()}
        environ = os.environ if environ is None else environ
        env = env_overrides(cls, {k: v for k, v in environ.items() if k not in SECRET_ENV})
        env["models"] = {r: os.path.abspath(p) for r, p in env.get("models", {}).items()}
        return cls.from_dict(merge(merge(engine, env), given(overrides)))
