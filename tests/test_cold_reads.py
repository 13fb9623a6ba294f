"""scripts/cold_reads.py, which the README cites for why an op runs slower inside a step than replayed: the L2, each
decoder's weights per layer, and reads of each size warm and after other reads."""

import os
import re

from safetensors import safe_open

from services.common.config import DEFAULT_CONFIG, EngineConfig
from tests.readme import run_script
from tests.zoo import needs_zoo

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer0_mib(model_dir: str) -> float:
    """Layer 0's linear weights as stored, float32 bytes in MiB: the reference for the script's count."""
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        names = [n for n in f.keys() if ".layers.0." in n and n.endswith(".weight") and n.split(".")[-2] in LINEARS]
        assert len(names) == len(LINEARS)
        return 4 * sum(f.get_slice(n).get_shape()[0] * f.get_slice(n).get_shape()[1] for n in names) / 2**20


@needs_zoo
def test_it_prints_the_l2_each_decoders_layer_and_warm_and_cold_reads():
    out = run_script("scripts/cold_reads.py", "--runs", "20", "--evict", "2")
    assert re.search(r"^L2 of cpu0: (\d+|\?) KiB$", out, re.M)
    models = EngineConfig.from_yaml(DEFAULT_CONFIG).models
    layers = dict(re.findall(r"^(\w+): ([\d.]+) MiB of float32 weights a layer$", out, re.M))
    assert set(layers) == {role for role in models if not role.startswith("filter")}  # the filter is no decoder
    for role, mib in layers.items():
        assert float(mib) == round(layer0_mib(models[role]), 1)
    assert re.search(r"^ +read, KiB +warm, us +after 2 MiB, us$", out, re.M)
    reads = re.findall(r"^ +(\d+) +([\d.]+) +([\d.]+)$", out, re.M)
    assert [size for size, _, _ in reads] == ["64", "256", "1024"]
    assert all(float(warm) > 0 and float(cold) > 0 for _, warm, cold in reads)
