"""Named strategies: each is a configuration of the four stages with its seed's defaults (README, "Strategies").

ar: baseline AR. mdm: LLaDA low-confidence remasking (004 §3.1.1). threshold: Fast-dLLM (001 §2.2, §4.1).
credit: 001 B.2 (beta, gamma, alpha are ours: 001 fixes only their ranges). hierarchical: 001 B.1, App. D.
guided: 003 Alg. 1, C.4, Table 11. slot: 000 §4.2, A.3, Table 5 (GSM8K row). streaming: 002 §5.2 Alg. 1, window
and distance penalty from §6.2's main setting, entropy threshold from §6.4's recommended range. learn2pd: 004
Alg. 2-3. pipeline: the product, streaming commit with guider agreement deciding and the Learn2PD filter keeping
drafts as context.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from services.common.params import parse_value
from services.common.proposal import Decision, Proposal, Region, Verdict
from services.dlm_drafter.bidirectional import CACHE_MODES, Smoothing
from services.orchestrator.commit import Commit
from services.orchestrator.gate import (
    AcceptAll,
    Credit,
    EntropyWindow,
    FilterGate,
    GuiderAgreement,
    Hierarchical,
    Threshold,
    TopN,
)
from services.orchestrator.propose import ARPropose
from services.orchestrator.slots import SlotGate, SlotPropose, SlotVerify
from services.orchestrator.verify import FilterScores, FilterVerify, GuiderVerify


@dataclass(slots=True)
class Stages:
    propose: Callable[..., Proposal]
    gate: Callable[..., Decision]
    commit: Commit
    verify: Callable[..., Verdict] | None = None
    holders: tuple = ()  # components keeping per-request state (KV caches)

    def release(self, request_id: str) -> None:
        for holder in self.holders:
            holder.release(request_id)


def check_prob(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def check_choice(name: str, value: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


DRAFTERS = ("causal", "bidirectional")


@dataclass(slots=True)
class ARParams:
    model: str = "ar"  # a role of the engine config: ar, guider or drafter

    def __post_init__(self):
        check_choice("model", self.model, ("ar", "guider", "drafter"))

    def build(self, models) -> Stages:
        model = models.autoregressive(self.model)
        return Stages(ARPropose(model), AcceptAll(), Commit("window", 1), holders=(model,))


@dataclass(slots=True)
class BlockParams:
    drafter: str = "bidirectional"
    block_size: int = 32
    cache: str = "none"
    smoothing: bool = False

    def __post_init__(self):
        check_choice("drafter", self.drafter, DRAFTERS)
        check_positive("block_size", self.block_size)
        check_choice("cache", self.cache, CACHE_MODES)

    def drafter_for(self, models, logits: bool = False):
        return models.drafter(self.drafter, self.cache, Smoothing() if self.smoothing else None, logits)

    def stages(self, models, gate, verify=None) -> Stages:
        drafter = self.drafter_for(models)
        return Stages(drafter.propose, gate, Commit("block", self.block_size), verify, holders=(drafter,))


@dataclass(slots=True)
class MDMParams(BlockParams):
    steps_per_block: int = 32

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_positive("steps_per_block", self.steps_per_block)

    def build(self, models) -> Stages:
        return self.stages(models, TopN(self.steps_per_block))


@dataclass(slots=True)
class ThresholdParams(BlockParams):
    block_size: int = 64
    cache: str = "dual"
    threshold: float = 0.9

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_prob("threshold", self.threshold)

    def build(self, models) -> Stages:
        return self.stages(models, Threshold(self.threshold))


@dataclass(slots=True)
class CreditParams(BlockParams):
    smoothing: bool = True
    threshold: float = 0.9
    beta: float = 0.7
    gamma: float = 0.5
    alpha: float = 1.0

    def __post_init__(self):
        BlockParams.__post_init__(self)
        for name in ("threshold", "beta", "gamma"):
            check_prob(name, getattr(self, name))
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")

    def build(self, models) -> Stages:
        drafter = self.drafter_for(models, logits=True)  # credits fuse the whole distribution
        gate = Credit(self.threshold, self.beta, self.gamma, self.alpha)
        return Stages(drafter.propose, gate, Commit("block", self.block_size), holders=(drafter,))


@dataclass(slots=True)
class HierarchicalParams(BlockParams):
    block_size: int = 64
    cache: str = "dual"
    threshold: float = 0.92
    low_threshold: float = 0.62

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_prob("threshold", self.threshold)
        check_prob("low_threshold", self.low_threshold)

    def build(self, models) -> Stages:
        return self.stages(models, Hierarchical(self.threshold, self.low_threshold))


@dataclass(slots=True)
class Learn2PDParams(BlockParams):
    filter_threshold: float = 0.96

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_prob("filter_threshold", self.filter_threshold)

    def build(self, models) -> Stages:
        filt = models.filter()
        if self.block_size > filt.config.block_size:
            raise ValueError(f"block_size {self.block_size} exceeds the filter's block of {filt.config.block_size}")
        return self.stages(models, FilterGate(self.filter_threshold), FilterVerify(FilterScores(filt)))


@dataclass(slots=True)
class GuidedParams(BlockParams):
    cache: str = "freecache"
    top_k_match: int = 1  # 003 Table 7's lossless setting; Table 11 uses 2, which accepts wrong digits on the tasks
    guidance_threshold: float = 0.5

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_positive("top_k_match", self.top_k_match)
        check_prob("guidance_threshold", self.guidance_threshold)

    def build(self, models) -> Stages:
        drafter, guider = self.drafter_for(models), models.guider()
        return Stages(
            drafter.propose,
            GuiderAgreement(self.top_k_match, self.guidance_threshold, bonus_token=False),
            Commit("block", self.block_size),
            GuiderVerify(guider, self.top_k_match),
            holders=(drafter, guider),
        )


@dataclass(slots=True)
class SlotParams:
    slot_size: int = 32
    block_size: int = 128
    slot_threshold: float = 0.9
    token_threshold: float = 0.4

    def __post_init__(self):
        check_positive("slot_size", self.slot_size)
        check_positive("block_size", self.block_size)
        if self.block_size % self.slot_size:
            raise ValueError(f"slot_size {self.slot_size} must divide block_size {self.block_size}")
        check_prob("slot_threshold", self.slot_threshold)
        check_prob("token_threshold", self.token_threshold)

    def build(self, models) -> Stages:
        drafter = models.drafter("causal")
        return Stages(
            SlotPropose(drafter, self.slot_size, self.slot_threshold),
            SlotGate(self.token_threshold),
            Commit("block", self.block_size, order="slot"),
            SlotVerify(drafter),
            holders=(drafter,),
        )


@dataclass(slots=True)
class StreamingParams:
    window: int = 6
    entropy_threshold: float = 0.4
    distance_penalty: float = 0.1

    def __post_init__(self):
        check_positive("window", self.window)
        if self.entropy_threshold < 0 or self.distance_penalty < 0:
            raise ValueError("entropy_threshold and distance_penalty must be >= 0")

    def build(self, models) -> Stages:
        drafter = models.drafter("causal")
        gate = EntropyWindow(self.entropy_threshold, self.distance_penalty)
        return Stages(drafter.propose, gate, Commit("window", self.window), holders=(drafter,))


@dataclass(slots=True)
class PipelineParams:
    window: int = 16
    top_k_match: int = 1  # lossless against the guider; 2 trades accuracy for acceptance (003 Table 11)
    guidance_threshold: float = 0.5
    bonus_token: bool = True
    filter_threshold: float = 0.96

    def __post_init__(self):
        check_positive("window", self.window)
        check_positive("top_k_match", self.top_k_match)
        check_prob("guidance_threshold", self.guidance_threshold)
        check_prob("filter_threshold", self.filter_threshold)

    def build(self, models) -> Stages:
        drafter, guider, filt = models.drafter("causal"), models.guider(), models.filter()
        if self.window > filt.config.block_size:
            raise ValueError(f"window {self.window} exceeds the filter's block of {filt.config.block_size}")
        gate = GuiderAgreement(self.top_k_match, self.guidance_threshold, self.bonus_token, self.filter_threshold)
        verify = GuiderVerify(guider, self.top_k_match, FilterScores(filt))
        return Stages(drafter.propose, gate, Commit("window", self.window), verify, holders=(drafter, guider))


STRATEGIES: dict[str, type] = {
    "ar": ARParams,
    "mdm": MDMParams,
    "threshold": ThresholdParams,
    "credit": CreditParams,
    "hierarchical": HierarchicalParams,
    "guided": GuidedParams,
    "slot": SlotParams,
    "streaming": StreamingParams,
    "learn2pd": Learn2PDParams,
    "pipeline": PipelineParams,
}


def make_params(strategy: str, overrides: dict[str, Any] | None = None):
    """Build a strategy's parameters from its defaults and overrides (strings from --set are parsed)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {sorted(STRATEGIES)}")
    cls = STRATEGIES[strategy]
    kinds = {f.name: f.type for f in fields(cls)}
    values = {}
    for key, raw in (overrides or {}).items():
        if key not in kinds:
            raise ValueError(f"unknown parameter {key!r} for strategy {strategy!r}; known: {sorted(kinds)}")
        kind = {"int": int, "float": float, "bool": bool, "str": str}.get(kinds[key], kinds[key])
        try:
            values[key] = parse_value(kind, raw)
        except ValueError as e:
            raise ValueError(f"parameter {key!r}: {e}") from None
    return cls(**values)


def defaults(strategy: str) -> dict[str, Any]:
    params = make_params(strategy)
    return {f.name: getattr(params, f.name) for f in fields(params)}


__all__ = ["STRATEGIES", "Stages", "make_params", "defaults", "Region"]
