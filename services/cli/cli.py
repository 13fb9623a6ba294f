"""The `dlm` command line. Torch and transformers load only in the commands that decode in process
(services/cli/local_cli.py): `dlm --help` and the gRPC client start without them."""

import argparse
import secrets
import sys

from services.cli.train_cli import register as register_training
from services.common.config import DEFAULT_CONFIG
from services.common.params import STRATEGY_NAMES


def cmd_generate(args) -> int:
    if args.seed is None:
        args.seed = secrets.randbelow(2**31)  # a fresh one, printed with --json so the text can be reproduced
    if args.target:
        from services.cli.remote_cli import generate_remote

        return generate_remote(args)
    from services.cli.local_cli import generate_local

    return generate_local(args)


def cmd_bench(args) -> int:
    load = bool(args.concurrency or args.target)  # a load run of one strategy, else the --strategies table
    if load and args.repeats != 1:
        raise ValueError("--repeats is for the --strategies rows; a load run (--concurrency, --target) has none")
    if not load and args.breakdown:
        raise ValueError("--breakdown breaks down a load run's rounds: add --concurrency or --target")
    if args.target and args.target.startswith(("http://", "https://")):
        if args.breakdown:
            raise ValueError("--breakdown reads the rounds a gRPC target reports; the OpenAI API reports none")
        from services.cli.openai_bench import bench_openai

        return bench_openai(args)
    if args.target:
        from services.cli.remote_cli import bench_remote

        return bench_remote(args)
    from services.cli.local_cli import bench_local

    return bench_local(args)


def cmd_eval(args) -> int:
    from services.cli.local_cli import eval_local

    return eval_local(args)


def serve_flags(args) -> dict:
    """The serving keys of `dlm serve`'s flags; None where a flag was not given, so the config's value stays."""
    return {"host": args.host, "port": args.port, "redis_url": args.redis}


def cmd_serve(args) -> int:
    if args.local:
        from services.cli.remote_cli import serve_local

        return serve_local(args.config, serve_flags(args), args.device, args.dtype, args.verbose)
    from services.cli.serve import serve_ray

    return serve_ray(args.config, serve_flags(args), args.device, args.dtype)


def cmd_index(args) -> int:
    from services.cli.index_cli import index_ls, index_show

    return index_show(args) if args.index_command == "show" else index_ls(args)


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

    gen = sub.add_parser("generate", help="decode one prompt, in process or on a server (--target)")
    gen.add_argument("prompt")
    gen.add_argument("--strategy", default=None, choices=sorted(STRATEGY_NAMES))
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
    ben.add_argument(
        "--repeats", type=int, default=1, help="with --strategies: the rows take turns N times, each keeps its median"
    )
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
    ben.add_argument("--strategy", default=None, choices=sorted(STRATEGY_NAMES), help="with --concurrency or --target")
    ben.add_argument(
        "--breakdown",
        action="store_true",
        help="with --concurrency or a gRPC --target: per round, the orchestrator, the hops, each model's compute "
        "and idle time, their overlap; per request, its latency in its rounds, before the first, between them and on "
        "its way in and out (median, p90, mean)",
    )
    ben.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="params of --strategy or each of --strategies"
    )
    client_flags(ben)
    ben.set_defaults(func=cmd_bench)

    ev = sub.add_parser("eval", help="held-out task accuracy, guider NLL and engine stats of a strategy")
    ev.add_argument("--strategy", default=None, choices=sorted(STRATEGY_NAMES))
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

    idx = sub.add_parser("index", help="what the cache index holds: live requests, their owners and replicas")
    verbs = idx.add_subparsers(dest="index_command", required=True)
    ls = verbs.add_parser("ls", help="one line per live request: strategy, owner and lease, replicas, tokens")
    show = verbs.add_parser("show", help="a request's whole record: prompt, sampling, commits, replicas, owner")
    show.add_argument("request_id")
    for verb in (ls, show):
        verb.add_argument("--redis-url", default=None, metavar="URL", help="default: the config's serving.redis_url")
    idx.set_defaults(func=cmd_index)
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
