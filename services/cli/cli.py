"""The `dlm` command line."""

import argparse
import json
import sys
from dataclasses import asdict

from services.cli.train_cli import register as register_training
from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.params import STATS_KEYS, format_logprobs, logprob_entry, parse_sets
from services.common.sampling import SamplingParams
from services.orchestrator.strategies import STRATEGIES
from services.training.tasks import FAMILIES


def engine_from(args):
    from services.orchestrator.engine import Engine

    return Engine(EngineConfig.from_yaml(args.config, device=args.device, dtype=args.dtype))


def cmd_generate(args) -> int:
    if args.target:
        from services.cli.remote_cli import generate_remote

        return generate_remote(args)
    engine = engine_from(args)
    sampling = SamplingParams(args.temperature, args.top_p, args.seed, logprobs=args.logprobs)
    params = parse_sets(args.set)
    logprobs = []

    def show(event):
        for token_id, lp in zip(event.ids, event.logprobs, strict=args.logprobs is not None):
            logprobs.append(logprob_entry(token_id, lp.logprob, lp.top, lp.verified))
        if not args.json:
            print(engine.decode_text(event.ids), end="", flush=True)

    result = engine.generate(args.prompt, args.strategy, params, args.max_new_tokens, sampling, on_commit=show)
    if args.json:
        stats = {k: result.stats[k] for k in STATS_KEYS}
        print(
            json.dumps(
                {
                    "text": result.text,
                    "token_ids": result.token_ids,
                    "finish_reason": result.finish_reason,
                    "stats": stats,
                }
                | ({"logprobs": logprobs} if args.logprobs is not None else {})
            )
        )
    else:
        print()
        if args.logprobs is not None:
            print(format_logprobs(logprobs))
    return 0


def cmd_bench(args) -> int:
    if args.target and args.target.startswith(("http://", "https://")):
        from services.cli.openai_bench import bench_openai

        return bench_openai(args)
    if args.target:
        from services.cli.remote_cli import bench_remote

        return bench_remote(args)
    engine = engine_from(args)
    if args.concurrency:
        from services.cli.load import engine_level, levels, table
        from services.common.params import BENCH_PROMPTS

        params = parse_sets(args.set)
        engine.generate(BENCH_PROMPTS[0], args.strategy, params, 4)  # load weights and warm up outside the timings
        rows = [
            engine_level(engine, c, BENCH_PROMPTS, args.strategy, params, args.max_new_tokens)
            for c in levels(args.concurrency)
        ]
    else:
        from services.cli.bench import bench, table

        strategies = [s for s in args.strategies.split(",") if s]
        for name in strategies:
            if name not in STRATEGIES:
                raise ValueError(f"unknown strategy {name!r}; choose from {sorted(STRATEGIES)}")
        rows = bench(engine, strategies, max_new_tokens=args.max_new_tokens)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
    return 0


def cmd_eval(args) -> int:
    from services.training.engine_eval import evaluate, mask_accuracy

    engine = engine_from(args)
    if args.suite == "masked":
        print(json.dumps({"suite": "masked", "mdm_accuracy": mask_accuracy(engine, n=args.n, seed=args.seed)}))
        return 0
    params = parse_sets(args.set)
    if args.model:
        params.setdefault(*model_param(args.strategy or engine.config.strategy, args.model))
    families = tuple(args.families.split(",")) if args.families else FAMILIES
    report = evaluate(engine, args.strategy, params, args.suite, args.n, args.seed, families)
    if args.json:
        print(json.dumps(report))
    else:
        for family, acc in report["accuracy"].items():
            print(f"{family:<8} {acc:6.1%}")
        stats = report["stats"]
        print(
            f"overall  {report['overall_accuracy']:6.1%}  nll {report['nll']:.3f}  TPF {stats['tpf']:.2f}  "
            f"p_cache {stats['p_cache']:.3f}  {stats['tokens_per_s']:.1f} tok/s"
        )
    return 0


def model_param(strategy: str, model: str) -> tuple[str, str]:
    """--model picks the AR model of `ar`, or the drafter family of the other strategies."""
    if strategy == "ar":
        return "model", model
    return "drafter", "bidirectional" if model in ("drafter_bidirectional", "bidirectional") else "causal"


def cmd_serve(args) -> int:
    if args.local:
        from services.cli.remote_cli import serve_local

        return serve_local(args.config, args.host, args.port, args.device, args.dtype)
    from services.cli.serve import serve_ray

    return serve_ray(args.config, args.host, args.port, args.redis)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlm", description="Serve diffusion language models fast.")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="engine YAML (default: configs/dlm.yaml)")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (overrides the config)")
    parser.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (overrides the config)")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt in-process")
    gen.add_argument("prompt")
    gen.add_argument("--strategy", default=None, choices=sorted(STRATEGIES))
    gen.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="strategy parameter")
    gen.add_argument("--max-new-tokens", type=int, default=None)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument(
        "--logprobs", type=int, default=None, metavar="N", help="each token's logprob and its N top alternatives"
    )
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--target", default=None, metavar="HOST:PORT", help="decode on a running server over gRPC")
    gen.set_defaults(func=cmd_generate)

    ben = sub.add_parser("bench", help="strategies vs the ar and mdm baselines on the same prompts")
    ben.add_argument("--strategies", default="threshold,guided,slot,streaming,pipeline")
    ben.add_argument("--max-new-tokens", type=int, default=64)
    ben.add_argument("--json", default=None, metavar="FILE")
    ben.add_argument(
        "--target",
        default=None,
        metavar="HOST:PORT",
        help="measure a running server over gRPC; http://HOST:PORT: its OpenAI API (TTFT, TPOT, tok/s)",
    )
    ben.add_argument(
        "--concurrency",
        default=None,
        help="requests kept in flight per level, e.g. 1,4,16: a load run of --strategy, in process or on --target "
        "(default there 1,4,16)",
    )
    ben.add_argument("--strategy", default=None, choices=sorted(STRATEGIES), help="with --concurrency or --target")
    ben.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the --strategy's parameters")
    ben.set_defaults(func=cmd_bench)

    ev = sub.add_parser("eval", help="held-out task accuracy, guider NLL and engine stats of a strategy")
    ev.add_argument("--strategy", default=None, choices=sorted(STRATEGIES))
    ev.add_argument("--model", default=None, help="ar: ar|guider|drafter; others: drafter|drafter_bidirectional")
    ev.add_argument(
        "--suite", default="tasks", choices=("tasks", "code", "masked"), help="masked: drafter MDM accuracy"
    )
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="strategy parameter")
    ev.add_argument("--n", type=int, default=20, help="held-out items per family")
    ev.add_argument("--families", default=None, help="comma-separated subset of count,copy,reverse,sort,add,code")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.set_defaults(func=cmd_eval)

    register_training(sub)

    srv = sub.add_parser("serve", help="deploy drafter, guider and filter on Ray Serve behind the gRPC orchestrator")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=50051)
    srv.add_argument("--redis", default=None, metavar="URL", help="cache index on Redis (default: embedded)")
    srv.add_argument("--local", action="store_true", help="serve gRPC on the in-process engine, without Ray")
    srv.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"dlm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
