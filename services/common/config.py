"""Engine configuration: which model directory plays which role, device and dtype; read from one YAML file."""

import os
from dataclasses import dataclass, field, fields

import yaml

ROLES = ("drafter", "drafter_bidirectional", "guider", "ar", "filter")
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "configs", "dlm.yaml")


@dataclass(slots=True)
class ServingConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    http_port: int = 8000  # the Serve HTTP proxy: the OpenAI-compatible API on host:http_port/v1
    num_gpus: float = 0  # per model deployment: 1 on a GPU cluster gives each model its own GPU
    max_concurrency: int = 64  # requests a step advances at once (vLLM's max_num_seqs); the rest wait
    micro_batches: int = 2  # served engines over the same replicas, stepping apart so that their stages overlap
    redis_url: str | None = None  # None: the embedded cache index
    replica_threads: int = 1  # torch threads per model replica on CPU: replicas share the cores, spinning OpenMP
    # threads of several processes on the same cores cost 10x
    kv_budget_tokens: int = 65536  # per drafter / guider replica
    max_queue: int = 64  # requests waiting for KV budget before RESOURCE_EXHAUSTED
    request_ttl_s: int = 600  # cache-index entries of abandoned requests expire

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ValueError(f"serving.port must be in (0, 65536), got {self.port}")
        counts = (self.max_concurrency, self.micro_batches, self.kv_budget_tokens)
        if min(counts) < 1 or min(self.num_gpus, self.max_queue) < 0:
            raise ValueError(
                "serving: num_gpus >= 0, max_queue >= 0, and >= 1: max_concurrency, micro_batches, kv_budget_tokens"
            )


@dataclass(slots=True)
class EngineConfig:
    models: dict[str, str] = field(default_factory=dict)  # role -> local directory
    device: str = "cpu"
    dtype: str = "float32"
    chat_template: bool = True  # wrap prompts with the tokenizer's chat template when it has one
    threads: int | None = None  # torch intra-op threads; None: torch's default (one per core)
    strategy: str = "pipeline"
    strategies: dict[str, dict] = field(default_factory=dict)  # per-strategy parameter overrides
    max_new_tokens: int = 128
    serving: ServingConfig = field(default_factory=ServingConfig)

    def __post_init__(self):
        if isinstance(self.serving, dict):
            self.serving = ServingConfig(**self.serving)
        unknown = set(self.models) - set(ROLES)
        if unknown:
            raise ValueError(f"models: unknown roles {sorted(unknown)}; roles are {ROLES}")
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
    def from_yaml(cls, path: str = DEFAULT_CONFIG, **overrides) -> "EngineConfig":
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        engine = raw.get("engine", raw)
        known = {f.name for f in fields(cls)}
        base = os.path.dirname(os.path.abspath(path))
        values = {k: v for k, v in engine.items() if k in known}
        values["models"] = {r: os.path.normpath(os.path.join(base, p)) for r, p in engine.get("models", {}).items()}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def replica_threads(config: "EngineConfig") -> None:
    """A model replica's torch threads: the config's `threads`, else serving.replica_threads on CPU."""
    import torch

    if config.threads or config.device == "cpu":
        torch.set_num_threads(config.threads or config.serving.replica_threads)
