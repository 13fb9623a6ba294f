"""Per-request decode metrics (TPF: dInfer 001 §4.1; p_cache: WeDLM 002 Eq. 4; tokens per model forward)."""

import time
from dataclasses import asdict, dataclass, field

COUNTERS = ("drafter_forwards", "guider_forwards", "filter_calls", "model_forwards", "drafter_tokens_processed")


@dataclass(slots=True)
class Stats:
    rounds: int = 0
    drafter_forwards: int = 0
    guider_forwards: int = 0
    filter_calls: int = 0
    model_forwards: int = 0  # every model call for this request (drafter + guider + filter), each counted
    tokens: int = 0
    drafter_tokens_processed: int = 0  # N_fwd: token instances through the drafter after prefill
    accepted: list[int] = field(default_factory=list)  # tokens decided per round
    proposed: list[int] = field(default_factory=list)  # masked positions the drafter proposed per round
    start_s: float = field(default_factory=time.perf_counter)
    first_commit_s: float | None = None
    end_s: float | None = None

    def counters(self) -> dict[str, int]:
        """The counts a remote stage adds to, as opposed to clocks that only mean something in one process."""
        return {k: getattr(self, k) for k in COUNTERS}

    def add(self, delta: dict[str, int]) -> None:
        for key, value in delta.items():
            setattr(self, key, getattr(self, key) + value)

    def on_commit(self, n: int) -> None:
        if n and self.first_commit_s is None:
            self.first_commit_s = time.perf_counter()

    def finish(self) -> None:
        self.end_s = time.perf_counter()

    def restart_clock(self) -> None:
        """A request resumed in another process: its clocks start again here (perf_counter is per process)."""
        self.start_s = time.perf_counter()
        if self.first_commit_s is not None:
            self.first_commit_s = self.start_s

    @property
    def tpf(self) -> float:
        """Tokens per forward: generated tokens over diffusion iterations (rounds)."""
        return self.tokens / max(self.rounds, 1)

    @property
    def tokens_per_forward(self) -> float:
        """Tokens per model call: unlike TPF, a slot round's two drafter forwards and a guided round's drafter and
        guider forwards each count, so strategies compare on what they cost."""
        return self.tokens / max(self.model_forwards, 1)

    @property
    def p_cache(self) -> float:
        """N_gen / N_fwd over the drafter's post-prefill forwards; 1.0 when no drafter ran (pure AR)."""
        return self.tokens / self.drafter_tokens_processed if self.drafter_tokens_processed else 1.0

    def to_dict(self) -> dict:
        end = self.end_s if self.end_s is not None else time.perf_counter()
        lists_and_clocks = ("accepted", "proposed", "start_s", "first_commit_s", "end_s")
        counts = {k: v for k, v in asdict(self).items() if k not in lists_and_clocks}
        return {
            **counts,
            "tpf": self.tpf,
            "tokens_per_forward": self.tokens_per_forward,
            "p_cache": self.p_cache,
            "accepted_per_round": sum(self.accepted) / max(len(self.accepted), 1),
            "ttft_s": (self.first_commit_s or end) - self.start_s,
            "wall_s": end - self.start_s,
        }
