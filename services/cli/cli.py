"""The `dlm` command line."""

import argparse
import json
import secrets
import sys
from contextlib import closing
from dataclasses import asdict

from services.cli.train_cli import register as register_training
from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.params import STATS_KEYS, format_logprobs, logprob_entry, parse_sets, stats_line
from services.common.sampling import SamplingParams
from services.orchestrator.decode.strategies import STRATEGIES
from services.training.tasks import FAMILIES


def engine_from(args):
    from services.orchestrator.engine.engine import Engine

    if not args.verbose:
        quiet_loading()
    return Engine(EngineConfig.from_yaml(args.config, device=args.device, dtype=args.dtype))


def quiet_loading() -> None:
    """No "Loading weights" progress bars or load-time warnings from transformers (this process is one command)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def cmd_generate(args) -> int:
    if args.seed is None:
        args.seed = secrets.randbelow(2**31)  # a fresh one, printed with --json so the text can be reproduced
    if args.target:
        from services.cli.remote_cli import generate_remote

        return generate_remote(args)
    from services.orchestrator.api.detok import TextStream, detokenizer

    engine = engine_from(args)
    sampling = SamplingParams(args.temperature, args.top_p, args.seed, logprobs=args.logprobs)
    req = engine.request(args.prompt, args.max_new_tokens, sampling)
    seq = engine.add(req, args.strategy, parse_sets(args.set))
    trace = recording(seq) if args.trace_png or args.trace_json else None
    text = TextStream(detokenizer(engine.tokenizer), args.stop)  # the server's stop logic
    logprobs = []
    with closing(engine.events(req)) as events:  # closing cancels at a stop
        for event in events:
            if args.logprobs is not None:
                pairs = zip(event.ids, event.logprobs, strict=True)
                logprobs += [logprob_entry(t, lp.logprob, lp.top, lp.verified) for t, lp in pairs]
            show(args, text.push(event.ids)[0])
            if text.stopped:
                break
    show(args, text.flush()[0])
    if trace is not None:
        write_trace(trace, args, req, engine)
    stats = req.stats.to_dict()
    logprobs = logprobs[: text.sent_ids]  # the tokens the text shows, up to the one that completed a stop string
    if args.json:
        from services.serving.wire import FINISH, FINISH_NAMES

        finish_reason = FINISH_NAMES[FINISH["stop"]] if text.stopped else req.finish_reason  # as over gRPC
        out = {
            "text": text.text,
            "token_ids": text.ids[: text.sent_ids],
            "finish_reason": finish_reason,
            "seed": args.seed,
            "stats": {k: stats[k] for k in STATS_KEYS},
        }
        print(json.dumps(out | ({"logprobs": logprobs} if args.logprobs is not None else {})))
    else:
        print()
        if args.logprobs is not None:
            print(format_logprobs(logprobs))
    if args.stats:
        print(stats_line(stats), file=sys.stderr)
    return 0


def show(args, delta: str) -> None:
    if delta and not args.json:
        print(delta, end="", flush=True)


def recording(seq):
    """Record each round of the sequence's decoding (its gate's decisions) for --trace-png / --trace-json."""
    from services.orchestrator.decode.trace import DecodingTrace, RecordingGate

    trace = DecodingTrace(seq.strategy)
    seq.stages.gate = RecordingGate(seq.stages.gate, trace)
    return trace


def write_trace(trace, args, req, engine) -> None:
    from services.orchestrator.decode.trace import finish

    finish(trace, req, engine.decode_text)
    if args.trace_json:
        with open(args.trace_json, "w") as f:
            json.dump(trace.to_dict(), f)
    if args.trace_png:
        from services.cli.plots import draw_decoding

        draw_decoding(trace, args.trace_png)


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
        params = parse_sets(args.set)  # for every listed strategy; the baselines keep their own
        rows = bench(engine, strategies, max_new_tokens=args.max_new_tokens, params=dict.fromkeys(strategies, params))
    print(table(rows))
    if args.plot:
        from services.cli.plots import draw_bench

        draw_bench(rows, args.plot, args.strategy or engine.config.strategy)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
    return 0


def cmd_eval(args) -> int:
    from services.training.engine_eval import baselines, evaluate, mask_accuracy

    engine = engine_from(args)
    if args.suite == "masked":
        print(json.dumps({"suite": "masked", "mdm_accuracy": mask_accuracy(engine, n=args.n, seed=args.seed)}))
        return 0
    params = parse_sets(args.set)
    if args.model:
        params.setdefault(*model_param(args.strategy or engine.config.strategy, args.model))
    families = tuple(args.families.split(",")) if args.families else FAMILIES
    report = evaluate(engine, args.strategy, params, args.suite, args.n, args.seed, families)
    if args.baselines:
        against = baselines(report["strategy"], {**engine.config.strategies.get(report["strategy"], {}), **params})
        report["baselines"] = {
            name: evaluate(engine, strategy, p, args.suite, args.n, args.seed, families)
            for name, (strategy, p) in against.items()
        }
    if args.json:
        print(json.dumps(report))
    else:
        for family, acc in report["accuracy"].items():
            print(f"{family:<8} {acc:6.1%}")
        stats = report["stats"]
        print(
            f"overall  {report['overall_accuracy']:6.1%}  nll {report['nll']:.3f}  TPF {stats['tpf']:.2f}  "
            f"tokens/forward {stats['tokens_per_forward']:.2f}  p_cache {stats['p_cache']:.3f}  "
            f"{stats['tokens_per_s']:.1f} tok/s"
        )
        for name, base in report.get("baselines", {}).items():
            accuracy, speed = base["overall_accuracy"], base["stats"]["tokens_per_s"]
            print(
                f"vs {name:<10} {accuracy:6.1%} ({report['overall_accuracy'] - accuracy:+.1%})  "
                f"{speed:.1f} tok/s ({stats['tokens_per_s'] / speed:.2f}x)"
            )
    return 0


def model_param(strategy: str, model: str) -> tuple[str, str]:
    """--model picks the AR model of `ar`, or the drafter family of the other strategies."""
    if strategy == "ar":
        return "model", model
    return "drafter", "bidirectional" if model in ("drafter_bidirectional", "bidirectional") else "causal"


def serve_flags(args) -> dict:
    """The serving keys of `dlm serve`'s flags; None where a flag was not given, so the config's value stays."""
    return {"host": args.host, "port": args.port, "redis_url": args.redis}


def cmd_serve(args) -> int:
    if args.local:
        from services.cli.remote_cli import serve_local

        return serve_local(args.config, serve_flags(args), args.device, args.dtype)
    from services.cli.serve import serve_ray

    return serve_ray(args.config, serve_flags(args))


def client_flags(parser: argparse.ArgumentParser) -> None:
    """How --target reaches a secured server; the token is read from a file or DLM_API_KEY, never a flag's value
    (flags show in `ps`)."""
    parser.add_argument("--api-key-file", default=None, metavar="FILE", help="bearer token (default: $DLM_API_KEY)")
    parser.add_argument("--tls-ca", default=None, metavar="PEM", help="gRPC over TLS, trusting this CA")
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="client certificate (mTLS), with --tls-key")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="the client certificate's key (mTLS)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlm", description="Serve diffusion language models fast.")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="engine YAML (default: configs/dlm.yaml)")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (overrides the config)")
    parser.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (overrides the config)")
    parser.add_argument("--verbose", action="store_true", help="show transformers' model-loading progress")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt in-process")
    gen.add_argument("prompt")
    gen.add_argument("--strategy", default=None, choices=sorted(STRATEGIES))
    gen.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="strategy parameter")
    gen.add_argument("--max-new-tokens", type=int, default=None)
    gen.add_argument("--seed", type=int, default=None, help="sampling seed (default: a fresh random one)")
    gen.add_argument("--stop", action="append", default=[], metavar="S", help="stop before this string (repeatable)")
    gen.add_argument("--stats", action="store_true", help="a one-line summary after the text (stderr)")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument(
        "--logprobs", type=int, default=None, metavar="N", help="each token's logprob and its N top alternatives"
    )
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--target", default=None, metavar="HOST:PORT", help="decode on a running server over gRPC")
    client_flags(gen)
    gen.add_argument("--trace-png", default=None, metavar="FILE", help="draw the decoding: positions against rounds")
    gen.add_argument("--trace-json", default=None, metavar="FILE", help="the picture's data: each token's round")
    gen.set_defaults(func=cmd_generate)

    ben = sub.add_parser("bench", help="strategies vs the ar and mdm baselines on the same prompts")
    ben.add_argument("--strategies", default="threshold,guided,slot,streaming,pipeline")
    ben.add_argument("--max-new-tokens", type=int, default=64)
    ben.add_argument("--json", default=None, metavar="FILE")
    ben.add_argument("--plot", default=None, metavar="FILE", help="PNG: tokens/s against TPF, or against concurrency")
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
    ben.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="params of --strategy or each of --strategies"
    )
    client_flags(ben)
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
    ev.add_argument(
        "--baselines",
        action="store_true",
        help="also the decodes it is weighed against: follow=guider the guider alone; else the drafter's own and ar",
    )
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.set_defaults(func=cmd_eval)

    register_training(sub)

    srv = sub.add_parser("serve", help="deploy drafter, guider and filter on Ray Serve behind the gRPC orchestrator")
    srv.add_argument("--host", default=None, help="gRPC host (default: the config's serving.host)")
    srv.add_argument("--port", type=int, default=None, help="gRPC port (default: the config's serving.port)")
    srv.add_argument("--redis", default=None, metavar="URL", help="cache index on Redis (default: serving.redis_url)")
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
