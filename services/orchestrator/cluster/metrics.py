"""The served engine's metrics through ray.serve.metrics: Ray exports them on its Prometheus endpoint (prefixed
`ray_`) with the deployment, replica and application tags, and the Ray dashboard graphs them. The names are vLLM's
where vLLM has one (k8s/grafana-dashboard.json graphs them)."""

from ray.serve.metrics import Counter, Gauge, Histogram

LATENCY_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60]
PER_TOKEN_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1]
TOKENS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64]
RATIO = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


class ServeMetrics:
    """Shared by the orchestrator's engines (one per micro-batch): the queue gauges sum over them."""

    def __init__(self):
        self.ttft = Histogram("dlm_time_to_first_token_seconds", "Request start to its first commit", LATENCY_S)
        self.e2e = Histogram("dlm_e2e_request_latency_seconds", "Request start to its end", LATENCY_S)
        self.tpot = Histogram(
            "dlm_time_per_output_token_seconds", "Latency after the first token, per token", PER_TOKEN_S
        )
        self.tokens_per_round = Histogram(
            "dlm_tokens_per_round", "Tokens decided in one round", TOKENS, tag_keys=("strategy",)
        )
        self.acceptance = Histogram(
            "dlm_draft_acceptance_ratio", "Decided over proposed positions in one round", RATIO, tag_keys=("strategy",)
        )
        self.running = Gauge("dlm_num_requests_running", "Requests the engines step")
        self.waiting = Gauge("dlm_num_requests_waiting", "Requests waiting for KV budget")
        self.prompt_tokens = Counter("dlm_prompt_tokens_total", "Prompt tokens of finished requests")
        self.generation_tokens = Counter("dlm_generation_tokens_total", "Output tokens of finished requests")
        self.success = Counter("dlm_request_success_total", "Finished requests", tag_keys=("finish_reason",))
        self.queues: dict[int, tuple[int, int]] = {}  # engine -> (running, waiting)

    def round(self, strategy: str, accepted: int, proposed: int) -> None:
        tags = {"strategy": strategy}
        self.tokens_per_round.observe(accepted, tags)
        if proposed:
            self.acceptance.observe(min(accepted / proposed, 1.0), tags)

    def finished(self, record: dict) -> None:
        self.ttft.observe(record["ttft_s"])
        self.e2e.observe(record["latency_s"])
        self.tpot.observe(record["tpot_s"])
        self.prompt_tokens.inc(record["prompt_tokens"])
        if record["output_tokens"]:
            self.generation_tokens.inc(record["output_tokens"])
        self.success.inc(1, {"finish_reason": record["finish_reason"] or "error"})

    def queue(self, engine: int, running: int, waiting: int) -> None:
        if self.queues.get(engine) == (running, waiting):
            return
        self.queues[engine] = (running, waiting)
        self.running.set(sum(r for r, _ in self.queues.values()))
        self.waiting.set(sum(w for _, w in self.queues.values()))
