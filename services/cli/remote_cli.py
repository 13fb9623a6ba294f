"""`dlm generate --target`, `dlm bench --target` and `dlm serve`: the CLI over gRPC."""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import grpc

from services.cli.breakdown import finish_level, from_trace, tables
from services.cli.client import DlmClient
from services.cli.load import LoadRow, Timing, levels, load_row, table, work
from services.cli.reconnect import StreamBroken
from services.common.config import EngineConfig
from services.common.params import BENCH_PROMPTS as PROMPTS
from services.common.params import STATS_KEYS, format_logprobs, logprob_entry, parse_sets, stats_line
from services.orchestrator.engine.round_timing import RoundTiming
from services.serving.security import api_key
from services.serving.wire import FINISH_NAMES, pb, stats_dict


def rpc_error(e: grpc.RpcError) -> int:
    print(f"dlm: error: {e.code().name}: {e.details()}", file=sys.stderr)
    return 2 if e.code() == grpc.StatusCode.INVALID_ARGUMENT else 1


def client_for(args) -> DlmClient:
    """A client of args.target with --api-key-file (else DLM_API_KEY) and the --tls-* files, where given."""
    token = api_key(getattr(args, "api_key_file", None))
    tls = {k: getattr(args, k, None) for k in ("tls_ca", "tls_cert", "tls_key")}
    return DlmClient(args.target, api_key=token, **tls)


def generate_remote(args) -> int:
    """Stream one prompt's text to the terminal as it commits, or print the in-process --json object."""
    kwargs = dict(
        strategy=args.strategy,
        params=parse_sets(args.set),
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        logprobs=getattr(args, "logprobs", None),
    )
    text, ids, logprobs, done = [], [], [], None
    try:
        with client_for(args) as client:
            for event in client.stream(args.prompt, **kwargs):
                if isinstance(event, pb.Chunk):
                    text.append(event.text)
                    ids.extend(event.token_ids)
                    logprobs.extend(entry(lp) for lp in event.logprobs)
                    if not args.json:
                        print(event.text, end="", flush=True)
                elif isinstance(event, pb.Complete):
                    done = event
    except grpc.RpcError as e:
        return rpc_error(e)
    except StreamBroken as e:  # and reconnecting for the client's resume_timeout did not resume it
        print(f"dlm: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        stats = stats_dict(done.stats)
        out = {
            "text": "".join(text),
            "token_ids": ids,
            "finish_reason": FINISH_NAMES[done.finish_reason],
            "seed": args.seed,
            "stats": {k: stats[k] for k in STATS_KEYS},
        }
        print(json.dumps(out | ({"logprobs": logprobs} if kwargs["logprobs"] is not None else {})))
    else:
        print()
        if kwargs["logprobs"] is not None:
            print(format_logprobs(logprobs))
    if args.stats:
        print(stats_line(stats_dict(done.stats)), file=sys.stderr)
    return 0


def entry(lp) -> dict:
    top = [(t.token_id, t.logprob) for t in lp.top]
    return logprob_entry(lp.token_id, lp.token, lp.logprob, top, [t.token for t in lp.top], lp.verified)


def timed_stream(client: DlmClient, prompt: str, kwargs: dict) -> tuple[Timing, list[RoundTiming]]:
    """One streamed request: latency, time to first chunk, completion tokens, rounds, and from its RoundTrace rows
    (each round's step, and when the server emitted it since the request arrived) the split of its latency; and its
    rounds' step timings."""
    start = time.perf_counter()
    first, tokens, rounds, trace = None, 0, 0, []
    for event in client.stream(prompt, trace=True, **kwargs):
        if isinstance(event, pb.Chunk) and first is None:
            first = time.perf_counter() - start
        elif isinstance(event, pb.Complete):
            tokens, rounds, trace = event.usage.completion_tokens, event.stats.rounds, list(event.trace)
    latency = time.perf_counter() - start
    stepped = [(row, t) for row in trace if (t := from_trace(row)) is not None]
    rounds_s = sum(t.round_s for _, t in stepped)
    before = stepped[0][0].elapsed_s - stepped[0][1].round_s if stepped else 0.0
    served = trace[-1].elapsed_s if trace else 0.0
    timing = Timing(latency, first if first is not None else latency, tokens, rounds, rounds_s, before, served)
    return timing, [t for _, t in stepped]


def load_level(
    client: DlmClient, concurrency: int, prompts: list[str], kwargs: dict
) -> tuple[LoadRow, list[RoundTiming]]:
    """`concurrency` streams at once over the prompt set."""
    sent = work(prompts, concurrency)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda p: timed_stream(client, p, kwargs), sent))
    row = load_row(concurrency, [timing for timing, _ in done], time.perf_counter() - start)
    return row, [step for _, steps in done for step in steps]


def bench_remote(args) -> int:
    """Aggregate throughput and latency of a running server at each concurrency level."""
    concurrency = levels(args.concurrency or "1,4,16")
    kwargs = dict(max_new_tokens=args.max_new_tokens, strategy=getattr(args, "strategy", None))
    if getattr(args, "set", None):
        kwargs["params"] = parse_sets(args.set)
    try:
        with client_for(args) as client:
            client.wait_ready()
            client.generate(PROMPTS[0], **{**kwargs, "max_new_tokens": 4})  # warm up outside the timings
            levels_run = [load_level(client, c, PROMPTS, kwargs) for c in concurrency]
    except grpc.RpcError as e:
        return rpc_error(e)
    # MFU's reference matmul runs here, on the served models' shapes from the local config: this machine's, on a
    # loopback target
    config = EngineConfig.from_yaml(args.config)
    rows = [finish_level(row, steps, config, args.breakdown) for row, steps in levels_run]
    print(table(rows))
    if args.breakdown:
        print(tables(rows))
    if args.plot:
        from services.cli.plots import draw_bench

        draw_bench(rows, args.plot, f"{args.strategy or 'server default'} on {args.target}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
    return 0


def serve_local(
    config_path: str, flags: dict, device: str | None = None, dtype: str | None = None, verbose: bool = False
) -> int:
    """Serve dlm.v1.DlmService on the in-process engine until SIGINT / SIGTERM; flags: serving keys given on the
    command line."""
    import asyncio
    import logging
    import uuid

    from services.cli.local_cli import quiet_loading
    from services.cli.serve import index_redis
    from services.common.config import EngineConfig
    from services.orchestrator.api.frontend import Frontend
    from services.orchestrator.api.grpc_server import serve
    from services.orchestrator.cluster.admission import local_admission
    from services.orchestrator.engine.engine import Engine
    from services.orchestrator.engine.local_executor import LocalExecutor

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        quiet_loading()
    config = EngineConfig.from_yaml(config_path, device=device, dtype=dtype, serving=flags)
    executor = LocalExecutor(config)
    with index_redis(config.serving):
        admission = local_admission(executor.placement, config.serving, f"local-{uuid.uuid4().hex[:8]}")
        backend = Frontend(Engine(config, executor, admission), records=admission)
        asyncio.run(serve(backend, f"{config.serving.host}:{config.serving.port}"))
    return 0
