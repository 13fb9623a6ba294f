"""`dlm generate`, `dlm bench` and `dlm eval` on the in-process engine (torch, transformers): imported only by the
commands that decode here, so that `dlm --help` and the gRPC client start without them."""

import json
import sys
import warnings
from contextlib import closing
from dataclasses import asdict

from services.common.config import EngineConfig
from services.common.params import STATS_KEYS, format_logprobs, logprob_entry, parse_sets, stats_line
from services.common.sampling import SamplingParams
from services.orchestrator.decode.strategies import STRATEGIES
from services.orchestrator.engine.engine import Engine
from services.training.tasks import FAMILIES


def engine_from(args) -> Engine:
    if not args.verbose:
        quiet_loading()
    return Engine(EngineConfig.from_yaml(args.config, device=args.device, dtype=args.dtype))


def quiet_loading() -> None:
    """No "Loading weights" progress bars, load-time warnings or deprecation notices from transformers (this process
    is one command, or `dlm serve --local`)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")


def generate_local(args) -> int:
    from services.orchestrator.api.detok import TextStream, detokenizer

    engine = engine_from(args)
    sampling = SamplingParams(args.temperature, args.top_p, args.seed, logprobs=args.logprobs)
    req = engine.request(args.prompt, args.max_new_tokens, sampling)
    er = engine.add(req, args.strategy, parse_sets(args.set))
    trace = recording(er) if args.trace_png or args.trace_json else None
    text = TextStream(detokenizer(engine.tokenizer), args.stop)  # the server's stop logic
    logprobs = []
    with closing(engine.outputs(req)) as events:  # closing cancels at a stop
        for event in events:
            if args.logprobs is not None:
                pairs = zip(event.ids, event.logprobs, strict=True)
                logprobs += [entry(engine.tokenizer, t, lp) for t, lp in pairs]
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


def entry(tokenizer, token_id: int, lp) -> dict:
    text = [tokenizer.decode([t]) for t, _ in lp.top]
    return logprob_entry(token_id, tokenizer.decode([token_id]), lp.logprob, lp.top, text, lp.verified)


def show(args, delta: str) -> None:
    if delta and not args.json:
        print(delta, end="", flush=True)


def recording(er):
    """Record each round of the request's decoding (its gate's decisions) for --trace-png / --trace-json."""
    from services.orchestrator.decode.trace import DecodingTrace, RecordingGate

    trace = DecodingTrace(er.strategy)
    er.stages.gate = RecordingGate(er.stages.gate, trace)
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


def bench_local(args) -> int:
    engine = engine_from(args)
    if args.concurrency:
        from services.cli.breakdown import finish_level
        from services.cli.load import engine_level, levels, table
        from services.common.params import BENCH_PROMPTS

        params = parse_sets(args.set)
        engine.generate(BENCH_PROMPTS[0], args.strategy, params, 4)  # load weights and warm up outside the timings
        rows = [
            finish_level(
                *engine_level(engine, c, BENCH_PROMPTS, args.strategy, params, args.max_new_tokens),
                engine.config,
                args.breakdown,
                engine.executor.call_on_worker,
            )
            for c in levels(args.concurrency)
        ]
    else:
        from services.cli.bench import bench, table

        strategies = [s for s in args.strategies.split(",") if s]
        for name in strategies:
            if name not in STRATEGIES:
                raise ValueError(f"unknown strategy {name!r}; choose from {sorted(STRATEGIES)}")
        params = parse_sets(args.set)  # for every listed strategy; the baselines keep their own
        per_strategy = dict.fromkeys(strategies, params)
        rows = bench(engine, strategies, max_new_tokens=args.max_new_tokens, params=per_strategy, repeats=args.repeats)
    print(table(rows))
    if args.breakdown and args.concurrency:
        from services.cli.breakdown import tables

        print(tables(rows))
    if args.plot:
        from services.cli.plots import draw_bench

        draw_bench(rows, args.plot, args.strategy or engine.config.strategy)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
    return 0


def eval_local(args) -> int:
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
