"""Decode BENCH_PROMPTS at c=16 with every strategy, greedy and seeded, overlap off and on,
and following the guider with lookahead, on the config's device:
one md5 per run, and the token ids as JSON (argv[2]), to compare across devices: python tokens.py CONFIG OUT.json"""

import hashlib
import json
import sys

from services.common.config import EngineConfig
from services.common.params import BENCH_PROMPTS
from services.common.sampling import SamplingParams
from services.orchestrator.engine.engine import Engine

RUNS = [
    (s, {})
    for s in ("ar", "mdm", "threshold", "credit", "hierarchical", "learn2pd", "streaming", "slot", "guided", "pipeline")
]
RUNS += [
    ("pipeline", {"overlap": True}),
    ("pipeline", {"overlap": True, "guesses": 16}),
    ("pipeline", {"follow": "guider"}),
    ("pipeline", {"follow": "guider", "overlap": True}),
    ("pipeline", {"follow": "guider", "lookahead": 3}),
]
config = EngineConfig.from_yaml(sys.argv[1])
print(config.device, config.dtype, file=sys.stderr)
engine = Engine(config)
prompts = [BENCH_PROMPTS[i % len(BENCH_PROMPTS)] for i in range(16)]
dump = {}
for strategy, params in RUNS:
    outs = []
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=7)):
        reqs = [engine.add_request(p, strategy, dict(params), max_new_tokens=32, sampling=sampling) for p in prompts]
        while engine.has_unfinished():
            for out in engine.step():
                if out.error is not None:
                    raise out.error
        outs.append([r.output_ids() for r in reqs])
    name = strategy + "".join(f" {k}={v}" for k, v in params.items())
    dump[name] = outs
    print(f"{name:32} {hashlib.md5(json.dumps(outs).encode()).hexdigest()}", flush=True)
json.dump(dump, open(sys.argv[2], "w"))
