"""Bytes a served round would send to the replicas and get back: the in-process engine on the shipped zoo, each call
group's arguments and replies pickled as they cross a hop (services/serving/pickling.py), per round per request; the
arguments both with each request whole and as the channel sends them (services/serving/request_sync.py: whole once,
then what changed), with the time to pickle and unpickle them (the hosts run on the latter).
`PYTHONPATH=. python scripts/hop_bytes.py [STRATEGY] [CONCURRENCY] [greedy|seeded]` (48 new tokens each)"""

import pickle
import sys
import time

import services.serving.pickling  # noqa: F401  the hop's reducers
from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.contract import ROLES, Groups, Parents, Results
from services.common.sampling import SamplingParams
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor
from services.serving.request_sync import Mirror, Sent

PROMPTS = ["sort: 58 68 49 27 13 91 67", "add 366+558=", "count from 1 to 9:", "reverse: a b c d e f"]


class Counting(LocalExecutor):
    """The in-process hosts behind a pickled hop, as test_one_step's stand-in handles: each group's arguments and
    replies cross as pickles, and are counted."""

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.out, self.out_whole, self.back = 0, 0, 0
        self.seconds, self.seconds_whole = 0.0, 0.0  # pickling and unpickling the arguments
        self.sent, self.mirror = Sent(), Mirror()

    def run(self, groups: Groups, parents: Parents) -> Results:
        start = time.perf_counter()
        whole = [pickle.dumps(args) for args in groups.values()]
        for data in whole:
            pickle.loads(data)
        middle = time.perf_counter()
        self.out_whole += sum(map(len, whole))
        sent = {
            key: pickle.dumps([self.sent.outgoing(ROLES[key[0]].host, a) for a in args]) for key, args in groups.items()
        }
        received = {key: [self.mirror.incoming(a) for a in pickle.loads(data)] for key, data in sent.items()}
        self.seconds += time.perf_counter() - middle
        self.seconds_whole += middle - start
        self.out += sum(map(len, sent.values()))
        results = super().run(received, parents)
        back = {key: pickle.dumps(replies) for key, replies in results.items()}
        self.back += sum(map(len, back.values()))
        return {key: pickle.loads(data) for key, data in back.items()}


def main() -> None:
    strategy = sys.argv[1] if len(sys.argv) > 1 else "pipeline"
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    seeded = len(sys.argv) > 3 and sys.argv[3] == "seeded"
    config = EngineConfig.from_yaml(DEFAULT_CONFIG)
    executor = Counting(config)
    engine = Engine(config, executor)
    sampling = SamplingParams(temperature=0.8, seed=7) if seeded else SamplingParams()
    reqs = [engine.request(PROMPTS[i % len(PROMPTS)], 48, sampling) for i in range(concurrency)]
    for req in reqs:
        engine.add(req, strategy)
    while engine.has_unfinished():
        engine.step()
    rounds = sum(len(req.stats.accepted) for req in reqs)
    print(
        f"{strategy} c={concurrency} {'seeded' if seeded else 'greedy'}: {rounds} request-rounds; per request-round "
        f"out {executor.out / rounds:.0f} B, back {executor.back / rounds:.0f} B; each request whole, out "
        f"{executor.out_whole / rounds:.0f} B; to pickle and unpickle the arguments "
        f"{1e6 * executor.seconds / rounds:.0f} us, whole {1e6 * executor.seconds_whole / rounds:.0f} us"
    )


if __name__ == "__main__":
    main()
