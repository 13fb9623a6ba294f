"""`dlm data` and `dlm train tokenizer|ar|drafter|filter` subcommands (wired into the dlm CLI via register)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def register(subparsers) -> None:
    d = subparsers.add_parser("data", help="build the task + corpus dataset deterministically")
    d.add_argument("--out", default="data")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=cmd_data)
    t = subparsers.add_parser("train", help="train the tokenizer, an AR model, a drafter or the Learn2PD filter")
    t.add_argument("what", choices=("tokenizer", "ar", "drafter", "filter"))
    t.add_argument("--config", required=True)
    t.add_argument("--device", choices=("cpu", "cuda"), default=None)
    t.add_argument("--resume", action="store_true")
    t.set_defaults(func=cmd_train)


def cmd_data(args: argparse.Namespace) -> int:
    from services.training.dataset import DataConfig, build

    print(json.dumps(build(DataConfig(out=args.out, seed=args.seed)), indent=1))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    if args.what == "tokenizer":
        from services.training.bpe import BpeConfig, special_ids, train_from_data

        cfg = BpeConfig(**(yaml.safe_load(Path(args.config).read_text()) or {}))
        print(json.dumps({"out": cfg.out, "special_ids": special_ids(train_from_data(cfg))}))
        return 0
    if args.what == "filter":
        from services.training.filter import FilterTrainConfig, train

        report = train(FilterTrainConfig.from_yaml(args.config, device=args.device))
        print(json.dumps({k: v for k, v in report.items() if k != "config"}))
        return 0
    from services.training.train_loop import TrainConfig

    over = {"device": args.device}
    if args.device == "cuda":
        over["dtype"] = "bfloat16"
    cfg = TrainConfig.from_yaml(args.config, **over)
    if args.what == "ar":
        from services.training.ar import run
    else:
        from services.training.drafter import run
    summary = run(cfg, resume=args.resume)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dlm")
    register(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
