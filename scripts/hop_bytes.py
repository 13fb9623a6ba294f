"""Bytes a served round would send to the replicas and get back: the in-process engine on the shipped zoo, each call
group's arguments and replies pickled as they cross a hop (services/serving/pickling.py), per round per request, and
which fields of the request the arguments spend them on.
`PYTHONPATH=. python scripts/hop_bytes.py [STRATEGY] [CONCURRENCY] [MAX_NEW_TOKENS]`"""

import pickle
import statistics
import sys
from collections import Counter
from dataclasses import fields

import services.serving.pickling  # noqa: F401  the hop's reducers
from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.contract import Groups, Parents, Results
from services.common.request import Request
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor

PROMPTS = ["sort: 58 68 49 27 13 91 67", "add 366+558=", "count from 1 to 9:", "reverse: a b c d e f"]


class Counting(LocalExecutor):
    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.out, self.back, self.fields = 0, 0, Counter()

    def run(self, groups: Groups, parents: Parents) -> Results:
        results = super().run(groups, parents)
        for key, args in groups.items():
            self.out += len(pickle.dumps(args))
            self.back += len(pickle.dumps(results[key]))
            for call in args:
                if hasattr(call, "req"):
                    for f in fields(Request):
                        self.fields[f.name] += len(pickle.dumps(getattr(call.req, f.name)))
        return results


def main() -> None:
    strategy = sys.argv[1] if len(sys.argv) > 1 else "pipeline"
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    max_new = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    config = EngineConfig.from_yaml(DEFAULT_CONFIG)
    executor = Counting(config)
    engine = Engine(config, executor)
    reqs = [engine.request(PROMPTS[i % len(PROMPTS)], max_new) for i in range(concurrency)]
    for req in reqs:
        engine.add(req, strategy)
    while engine.has_unfinished():
        engine.step()
    rounds = sum(req.stats.rounds for req in reqs)
    print(
        f"{strategy} c={concurrency}: {rounds} request-rounds, per request-round: "
        f"out {executor.out / rounds:.0f} B, back {executor.back / rounds:.0f} B"
    )
    print(
        "out, by request field: "
        + ", ".join(f"{name} {n / rounds:.0f}" for name, n in executor.fields.most_common() if n / rounds >= 1)
    )
    print(f"median tokens per round {statistics.median(a for req in reqs for a in req.stats.accepted)}")


if __name__ == "__main__":
    main()
