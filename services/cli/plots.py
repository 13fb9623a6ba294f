"""Pictures (matplotlib, the `plots` extra): one request's decoding (`dlm generate --trace-png`) and a benchmark
(`dlm bench --plot`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.cli.load import LoadRow

if TYPE_CHECKING:  # `dlm bench --target --plot` draws without torch
    from services.cli.bench import BenchRow
    from services.orchestrator.decode.trace import DecodingTrace


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def draw_decoding(trace: DecodingTrace, path: str) -> None:
    """Output position against round: committed tokens where they were decided, proposals the gate rejected, and
    the frontier (the decided prefix) after each round. Out-of-order decoding shows as dots above the frontier."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    rejected = [(r.round, p) for r in trace.rounds for p in sorted(set(r.proposed) - set(r.decided))]
    if rejected:
        ax.scatter(*zip(*rejected, strict=True), marker="x", s=18, color="0.7", label="drafted, not accepted")
    committed = [(t["round"], t["position"]) for t in trace.tokens]
    if committed:
        ax.scatter(*zip(*committed, strict=True), s=28, color="tab:blue", label="committed token", zorder=3)
    steps = [0] + [r.round for r in trace.rounds]
    frontier = [0] + [r.frontier for r in trace.rounds]
    ax.step(steps, frontier, where="post", color="tab:red", label="frontier (decided prefix)", zorder=2)
    rounds = max(len(trace.rounds), 1)
    ax.set_title(
        f"{trace.strategy}: {len(trace.tokens)} tokens in {rounds} rounds (TPF {len(trace.tokens) / rounds:.2f})"
    )
    ax.set_xlabel("round")
    ax.set_ylabel("output position")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def draw_bench(rows: list[BenchRow] | list[LoadRow], path: str, label: str = "") -> None:
    """Strategies: tokens/s against TPF, one point per strategy. Load levels: tokens/s against concurrency."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    if rows and isinstance(rows[0], LoadRow):
        ax.plot([r.concurrency for r in rows], [r.tokens_per_s for r in rows], marker="o", label=label or "tokens/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks([r.concurrency for r in rows], [str(r.concurrency) for r in rows])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_title("Throughput against concurrency")
    else:
        for r in rows:
            ax.scatter(r.tpf, r.tokens_per_s, s=40, label=r.strategy)
            ax.annotate(r.strategy, (r.tpf, r.tokens_per_s), textcoords="offset points", xytext=(5, 4))
        ax.set_xlabel("tokens per forward (TPF)")
        ax.set_title("Throughput against tokens per forward, per strategy")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
