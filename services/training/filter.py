"""Train a Learn2PD filter (004 §3.2, Alg. 1) on Extremely Greedy Parallel trajectories of one drafter family.

Each family has its own filter, trained on its own drafter's confidences: `causal` (the pipeline's drafter) and
`bidirectional` (learn2pd's). Reference answer: a decode of the prompt by `reference`, each drafter's own: the
bidirectional drafter's `mdm`, the causal drafter's AR decode (the output the pipeline follows). It runs past the
reference's EOS to the end of that block with EOS, as an MDM's canvas is filled after its end of text (004 §3.3), so
the filter also sees the trailing end-of-text region that EoTP reads.

EGP oracle: at every step of a block, a masked position is unmasked iff the drafter's prediction equals the reference
(004 §3.1.3); when none does, the most confident position takes its reference token so the block moves on. Each step
yields the block's confidences (decided positions count as 1.0; a short last block is padded by `pad_blocks`, as
inference pads) and per masked position the label `prediction == reference`; the 2-layer MLP learns them with BCE,
AdamW, full-batch epochs (004 §4).
"""

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field

import torch
import yaml
from tqdm import tqdm

from services.common.config import EngineConfig
from services.common.contract import FAMILIES, Propose, ProposeBidirectional
from services.common.proposal import Proposal, Region
from services.common.request import Request
from services.filter.model import FilterConfig, Learn2PDFilter, pad_blocks
from services.orchestrator.engine.engine import Engine, Prompt
from services.training import tasks

Row = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (confidence, label, active), each [block]


@dataclass(slots=True)
class FilterTrainConfig:
    drafter: str = "bidirectional"  # the drafter family whose trajectories train this filter
    models: dict[str, str] = field(default_factory=lambda: {"drafter_bidirectional": "models/drafter-bidirectional"})
    reference: str = "mdm"  # the strategy whose decode is the reference answer
    reference_params: dict = field(default_factory=dict)
    out: str = "models/filter-bidirectional"
    prompts_per_family: int = 30
    families: tuple[str, ...] = ("count", "copy", "reverse", "sort", "add")
    max_new_tokens: int = 64
    batch_size: int = 16  # prompts whose trajectories advance together, one drafter call per step
    block_size: int = 32  # 004 §4.1
    hidden_size: int = 32  # 004 §4: 2,112 parameters at block 32
    threshold: float = 0.96  # 004 §4.3
    epochs: int = 5000  # 004 §4
    lr: float = 1e-3  # 004 §4, AdamW
    val_fraction: float = 0.2
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self):
        self.families = tuple(self.families)
        if self.drafter not in FAMILIES:
            raise ValueError(f"drafter must be one of {FAMILIES}, got {self.drafter!r}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if min(self.prompts_per_family, self.epochs, self.batch_size) < 1:
            raise ValueError("prompts_per_family, epochs and batch_size must be >= 1")

    @classmethod
    def from_yaml(cls, path: str, **overrides) -> "FilterTrainConfig":
        with open(path) as f:
            values = yaml.safe_load(f) or {}
        return cls(**{**values, **{k: v for k, v in overrides.items() if v is not None}})


@dataclass(slots=True)
class Trajectories:
    confidence: torch.Tensor  # [N, block]
    label: torch.Tensor  # [N, block] 1 = the prediction equals the reference
    active: torch.Tensor  # [N, block] masked positions of that step (the only ones with a label)


def references(engine: Engine, prompts: list[Prompt], cfg: FilterTrainConfig) -> list[torch.Tensor]:
    """Each prompt's reference answer [end]: the reference decode, then EOS up to the end of its EOS's block."""
    results = engine.generate(prompts, cfg.reference, cfg.reference_params, cfg.max_new_tokens)
    eos = engine.executor.meta().eos_id
    answers = []
    for result in results:
        ids = result.token_ids + ([eos] if result.finish_reason == "eos" else [])
        end = min(-(-len(ids) // cfg.block_size) * cfg.block_size, cfg.max_new_tokens)
        answers.append(torch.tensor(ids + [eos] * (end - len(ids)), dtype=torch.long))
    return answers


def propose(engine: Engine, drafter: str, calls: list[tuple[Request, Region]]) -> list[Proposal]:
    host = engine.executor.host("drafter")
    if drafter == "causal":
        replies = host.propose([Propose(req, region) for req, region in calls])
    else:
        replies = host.propose_bidirectional([ProposeBidirectional(req, region, "none") for req, region in calls])
    return [reply.value for reply in replies]


def egp(engine: Engine, prompts: list[Prompt], cfg: FilterTrainConfig) -> list[Row]:
    """The prompts' EGP trajectories, advanced together: a (confidence, label, active) row per drafter forward."""
    answers = references(engine, prompts, cfg)
    reqs = [engine.request(prompt, cfg.max_new_tokens) for prompt in prompts]
    for req, answer in zip(reqs, answers, strict=True):
        req.horizon = len(answer)
    rows = []
    while live := [(req, answer) for req, answer in zip(reqs, answers, strict=True) if req.frontier < len(answer)]:
        regions = [current_block(req, len(answer), cfg.block_size) for req, answer in live]
        calls = [(req, region) for (req, _), region in zip(live, regions, strict=True)]
        for (req, answer), region, proposal in zip(live, regions, propose(engine, cfg.drafter, calls), strict=True):
            rows.append(egp_step(req, answer, region, proposal, cfg.block_size))
    engine.executor.host("drafter").release([req.id for req in reqs])
    return rows


def current_block(req: Request, end: int, block_size: int) -> Region:
    start = req.frontier // block_size * block_size
    return Region(start, min(start + block_size, end))


def egp_step(req: Request, answer: torch.Tensor, region: Region, proposal: Proposal, block_size: int) -> Row:
    """One step's row; unmasks the proposals that equal the answer (or the most confident one, if none does)."""
    rel = proposal.positions - region.start
    confidence = torch.ones(region.end - region.start)
    confidence[rel] = proposal.probs
    confidence = pad_blocks([confidence], block_size)[0]
    label, active = torch.zeros(block_size), torch.zeros(block_size)
    match = proposal.ids == answer[proposal.positions]
    label[rel], active[rel] = match.float(), 1.0
    if not match.any():
        match[proposal.probs.argmax()] = True
    req.decide(proposal.positions[match], answer[proposal.positions[match]])
    req.horizon = len(answer)  # deciding an EOS truncates the canvas; the oracle runs on to the answer's end
    return confidence, label, active


def record(engine: Engine, prompts: list[Prompt], cfg: FilterTrainConfig) -> Trajectories:
    batches = [prompts[i : i + cfg.batch_size] for i in range(0, len(prompts), cfg.batch_size)]
    rows = [row for batch in tqdm(batches, desc="EGP trajectories") for row in egp(engine, batch, cfg)]
    return Trajectories(*(torch.stack(col) for col in zip(*rows, strict=True)))


def bce(model: Learn2PDFilter, data: Trajectories) -> torch.Tensor:
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(data.confidence), data.label, reduction="none")
    return (loss * data.active).sum() / data.active.sum()


def precision_recall(model: Learn2PDFilter, data: Trajectories, threshold: float) -> tuple[float, float]:
    with torch.no_grad():
        accept = (torch.sigmoid(model(data.confidence)) > threshold) & data.active.bool()
    truth = data.label.bool() & data.active.bool()
    tp = (accept & truth).sum().item()
    return tp / max(accept.sum().item(), 1), tp / max(truth.sum().item(), 1)


def fit(data: Trajectories, cfg: FilterTrainConfig) -> tuple[Learn2PDFilter, dict]:
    torch.manual_seed(cfg.seed)
    order = torch.randperm(len(data.confidence))
    n_val = max(1, int(len(order) * cfg.val_fraction))
    split = {"val": order[:n_val], "train": order[n_val:]}
    parts = {k: Trajectories(*(t[idx] for t in (data.confidence, data.label, data.active))) for k, idx in split.items()}
    model = Learn2PDFilter(FilterConfig(cfg.block_size, cfg.hidden_size, cfg.threshold))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    curve = []
    for _ in tqdm(range(cfg.epochs), desc="filter"):
        opt.zero_grad()
        loss = bce(model, parts["train"])
        loss.backward()
        opt.step()
        curve.append(loss.item())
    model.eval()
    report = {
        "rows": {k: len(v.confidence) for k, v in parts.items()},
        "parameters": sum(p.numel() for p in model.parameters()),
        "initial_train_bce": curve[0],
    }
    with torch.no_grad():
        for name, part in parts.items():
            precision, recall = precision_recall(model, part, cfg.threshold)
            report[name] = {"bce": bce(model, part).item(), "precision": precision, "recall": recall}
    report["positive_rate"] = (data.label * data.active).sum().item() / data.active.sum().item()
    return model, report


def train(cfg: FilterTrainConfig, engine: Engine | None = None) -> dict:
    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    engine = engine or Engine(EngineConfig(models=cfg.models, device=cfg.device))
    items = [t for family in cfg.families for t in tasks.generate(family, cfg.prompts_per_family, "train", cfg.seed)]
    random.Random(cfg.seed).shuffle(items)
    data = record(engine, [t.prompt for t in items], cfg)
    model, report = fit(data, cfg)
    model.save(cfg.out)
    report.update(config=asdict(cfg), wall_s=time.perf_counter() - start)
    with open(os.path.join(cfg.out, "train_summary.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(cfg.out, "README.md"), "w") as f:
        f.write(card(report, cfg))
    return report


def card(report: dict, cfg: FilterTrainConfig) -> str:
    val, train = report["val"], report["train"]
    name = os.path.basename(os.path.normpath(cfg.out))
    reference = " ".join([cfg.reference, *(f"{k}={v}" for k, v in cfg.reference_params.items())])
    drafter = cfg.models["drafter" if cfg.drafter == "causal" else "drafter_bidirectional"]
    return f"""# {name}

Learn2PD filter (004 §3.2) of the **{cfg.drafter}** drafter: a 2-layer MLP ({cfg.block_size} -> {cfg.hidden_size} ->
{cfg.block_size}, {report["parameters"]:,} parameters) from a block's confidences (decided positions count as 1.0) to
per-position accept logits; accept when sigmoid > {cfg.threshold}.

## Training
- trajectories: Extremely Greedy Parallel (004 §3.1.3) on `{drafter}`; reference answer: the `{reference}` decode,
  continued with EOS to the end of its EOS's block (the end-of-text region, 004 §3.3); blocks of {cfg.block_size};
  {cfg.prompts_per_family} train prompts per family of {", ".join(cfg.families)}; {report["rows"]["train"]} train /
  {report["rows"]["val"]} validation steps; {report["positive_rate"]:.1%} of masked positions were already right
- BCE on masked positions, AdamW lr {cfg.lr}, {cfg.epochs} full-batch epochs (004 §4), seed {cfg.seed}
- wall time {report["wall_s"]:.0f} s

## Results
| split | BCE | precision | recall |
|---|---|---|---|
| train | {train["bce"]:.3f} | {train["precision"]:.3f} | {train["recall"]:.3f} |
| validation | {val["bce"]:.3f} | {val["precision"]:.3f} | {val["recall"]:.3f} |

Initial train BCE {report["initial_train_bce"]:.3f}. Precision and recall are of accept decisions at the threshold.

Rebuild: `dlm train filter --config configs/train/{name}.yaml`
"""
