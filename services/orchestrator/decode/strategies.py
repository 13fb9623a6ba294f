"""Named strategies: each is a configuration of the four stages with its seed's defaults (README, "Strategies").

ar: baseline AR. mdm: LLaDA low-confidence remasking (004 §3.1.1). threshold: Fast-dLLM (001 §2.2, §4.1).
credit: 001 B.2 (beta, gamma, alpha are ours: 001 fixes only their ranges). hierarchical: 001 B.1, App. D.
guided: 003 Alg. 1, C.4, Table 11. slot: 000 §4.2, A.3, Table 5 (GSM8K row). streaming: 002 §5.2 Alg. 1, window
and distance penalty from §6.2's main setting, entropy threshold from §6.4's recommended range. learn2pd: 004
Alg. 2-3. pipeline: the product, the causal drafter's drafts from the frontier, with guider agreement and the Learn2PD
filter deciding how many to accept. guided and pipeline follow the drafter (003 Alg. 1) or, with follow=guider, the
guider (speculative decoding, lossless against its greedy decode).
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

from services.common.contract import CACHE_MODES, FAMILIES, FILTER_MODELS, Role, Smoothing, Stage, Vicinity
from services.common.params import parse_value
from services.common.proposal import Decision, Proposal, Region, Verdict
from services.common.request import Request
from services.orchestrator.decode.commit import Commit
from services.orchestrator.decode.gate import (
    FOLLOW,
    AcceptAll,
    Credit,
    EntropyWindow,
    FilterGate,
    GuiderAgreement,
    Hierarchical,
    Threshold,
    TopN,
)
from services.orchestrator.decode.lookahead import GuiderLookahead
from services.orchestrator.decode.overlap import PostVerify
from services.orchestrator.decode.propose import FRONTIER_HEADS, ARPropose, BidirectionalPropose, CausalPropose
from services.orchestrator.decode.slots import KV_MODES, SlotGate, SlotPropose, SlotVerify
from services.orchestrator.decode.verify import FilterVerify, GuiderVerify

Proposer = Callable[[Request, Region], Stage[Proposal]]  # a propose stage (propose.py, slots.py)
Verifier = Callable[[Request, Region, Proposal], Stage[Verdict]]  # a verify stage (verify.py, slots.py)
Gate = Callable[[Request, Region, Proposal, Verdict | None], Decision]


class Catalog(Protocol):
    """What building a strategy needs to know of the models being served."""

    roles: frozenset[str]  # the configured model roles, and drafter_ar where the causal drafter decodes AR

    def filter_block_size(self, drafter: str) -> int: ...


@dataclass(slots=True)
class Stages:
    propose: Proposer
    gate: Gate
    commit: Commit
    verify: Verifier | None = None
    roles: tuple[str, ...] = ()  # hosts keeping this request's KV, released when it ends


def need(catalog: Catalog, *roles: str) -> None:
    for role in roles:
        if role not in catalog.roles:
            served = sorted(catalog.roles)
            raise ValueError(f"model {str(role)!r} is not served here (served: {served})")


def check_filter_block(catalog: Catalog, drafter: str, name: str, size: int) -> None:
    """The filter of the drafter's family (each is trained on its own drafter's confidences) reads the block."""
    need(catalog, FILTER_MODELS[drafter])
    if size > catalog.filter_block_size(drafter):
        raise ValueError(f"{name} {size} exceeds the filter's block of {catalog.filter_block_size(drafter)}")


def check_prob(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def check_non_negative(name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_choice(name: str, value: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclass(slots=True)
class ARParams:
    model: str = "ar"  # a role of the engine config: ar, guider or drafter

    def __post_init__(self):
        check_choice("model", self.model, ("ar", "guider", "drafter"))

    def build(self, catalog: Catalog) -> Stages:
        role = Role.DRAFTER_AR if self.model == "drafter" else Role(self.model)
        need(catalog, role)
        return Stages(ARPropose(role), AcceptAll(), Commit("frontier", 1), roles=(role,))


@dataclass(slots=True)
class BlockParams:
    drafter: str = "bidirectional"
    block_size: int = 32
    cache: str = "none"
    smoothing: bool = False
    threshold_decay: float = 0.02  # with smoothing, the threshold falls from 1.0 by this per round (001 A.1)
    prefix_look: int = 16  # cache=vicinity: positions recomputed before and after the block (001 App. D)
    after_look: int = 16
    warmup_times: int = 4  # cache=vicinity: the request's first forwards run uncached (001 App. D)
    eos: ClassVar[str] = "truncate"  # what a decided EOS does on the bidirectional drafter (commit.py, EOS_POLICIES)

    def __post_init__(self):
        check_choice("drafter", self.drafter, FAMILIES)
        check_positive("block_size", self.block_size)
        check_choice("cache", self.cache, CACHE_MODES)
        check_prob("threshold_decay", self.threshold_decay)
        for name in ("prefix_look", "after_look", "warmup_times"):
            check_non_negative(name, getattr(self, name))

    def decay(self) -> float | None:
        """IterSmooth's threshold schedule goes with iteration smoothing (001 A.1)."""
        return self.threshold_decay if self.smoothing else None

    def proposer(self, catalog: Catalog, keep_logits: bool = False, ar_head: bool = False) -> Proposer:
        need(catalog, "drafter" if self.drafter == "causal" else "drafter_bidirectional")
        if self.drafter == "causal":
            return CausalPropose(keep_logits, ar_head)
        vicinity = Vicinity(self.prefix_look, self.after_look, self.warmup_times)
        return BidirectionalPropose(self.cache, Smoothing() if self.smoothing else None, keep_logits, vicinity)

    def committer(self) -> Commit:
        """A causal drafter's predictions before an EOS never see past it: it keeps EOS truncation (000 B.1)."""
        return Commit("block", self.block_size, eos=self.eos if self.drafter == "bidirectional" else "truncate")

    def stages(
        self, catalog: Catalog, gate: Gate, verify: Verifier | None = None, *roles: str, ar_head: bool = False
    ) -> Stages:
        return Stages(self.proposer(catalog, ar_head=ar_head), gate, self.committer(), verify, ("drafter", *roles))


@dataclass(slots=True)
class MDMParams(BlockParams):
    steps_per_block: int = 32
    eos: ClassVar[str] = "full"

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_positive("steps_per_block", self.steps_per_block)

    def build(self, catalog: Catalog) -> Stages:
        return self.stages(catalog, TopN(self.steps_per_block))


@dataclass(slots=True)
class ThresholdParams(BlockParams):
    block_size: int = 64
    cache: str = "dual"
    threshold: float = 0.9
    eos: ClassVar[str] = "full"

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_prob("threshold", self.threshold)

    def build(self, catalog: Catalog) -> Stages:
        return self.stages(catalog, Threshold(self.threshold, self.decay()))


@dataclass(slots=True)
class CreditParams(BlockParams):
    block_size: int = 64  # 001 §4.1: "a block size of 64 for all experiments"
    smoothing: bool = True
    threshold: float = 0.9
    beta: float = 0.7
    gamma: float = 0.5
    alpha: float = 1.0
    eos: ClassVar[str] = "fill"

    def __post_init__(self):
        BlockParams.__post_init__(self)
        for name in ("threshold", "beta", "gamma"):
            check_prob(name, getattr(self, name))
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")

    def build(self, catalog: Catalog) -> Stages:
        propose = self.proposer(catalog, keep_logits=True)  # credits fuse the whole distribution
        gate = Credit(self.threshold, self.beta, self.gamma, self.alpha, self.decay())
        return Stages(propose, gate, self.committer(), roles=("drafter",))


@dataclass(slots=True)
class HierarchicalParams(BlockParams):
    block_size: int = 64
    cache: str = "dual"
    threshold: float = 0.92
    low_threshold: float = 0.62
    eos: ClassVar[str] = "fill"

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_prob("threshold", self.threshold)
        check_prob("low_threshold", self.low_threshold)

    def build(self, catalog: Catalog) -> Stages:
        return self.stages(catalog, Hierarchical(self.threshold, self.low_threshold, self.decay()))


@dataclass(slots=True)
class Learn2PDParams(BlockParams):
    filter_threshold: float = 0.96
    eos: ClassVar[str] = "eotp"

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_prob("filter_threshold", self.filter_threshold)

    def build(self, catalog: Catalog) -> Stages:
        check_filter_block(catalog, self.drafter, "block_size", self.block_size)
        return self.stages(catalog, FilterGate(self.filter_threshold), FilterVerify(self.drafter))


@dataclass(slots=True)
class GuidedParams(BlockParams):
    cache: str = "freecache"
    top_k_match: int = 1  # 003 Table 7's setting; Table 11 uses 2, which accepts wrong digits on the tasks
    guidance_threshold: float = 0.5
    follow: str = "drafter"  # whose tokens the output is (gate.py, GuiderAgreement): 003 Alg. 1's drafter, or guider
    frontier_head: str = "ar"  # drafter=causal: the frontier's draft from its next-token head or its mask (propose.py)

    def __post_init__(self):
        BlockParams.__post_init__(self)
        check_positive("top_k_match", self.top_k_match)
        check_prob("guidance_threshold", self.guidance_threshold)
        check_choice("follow", self.follow, FOLLOW)
        check_choice("frontier_head", self.frontier_head, FRONTIER_HEADS)

    def committer(self) -> Commit:
        """block_size is 003 Table 11's speculation block: the guider verifies that many drafts from the frontier, so
        acceptance crosses block ends (the drafter drafts every masked token; C.1: block_length "is not used")."""
        return Commit("frontier", self.block_size)

    def build(self, catalog: Catalog) -> Stages:
        need(catalog, "guider")
        gate = GuiderAgreement(self.top_k_match, self.guidance_threshold, False, follow=self.follow)
        return self.stages(catalog, gate, GuiderVerify(self.top_k_match), "guider", ar_head=self.frontier_head == "ar")


@dataclass(slots=True)
class SlotParams:
    slot_size: int = 32
    block_size: int = 128
    slot_threshold: float = 0.9
    token_threshold: float = 0.4
    kv: str = "reuse"  # 000 §4.2; "recompute" is Table 8's w/ KV Re-computation

    def __post_init__(self):
        check_positive("slot_size", self.slot_size)
        check_positive("block_size", self.block_size)
        if self.block_size % self.slot_size:
            raise ValueError(f"slot_size {self.slot_size} must divide block_size {self.block_size}")
        check_prob("slot_threshold", self.slot_threshold)
        check_prob("token_threshold", self.token_threshold)
        check_choice("kv", self.kv, KV_MODES)

    def build(self, catalog: Catalog) -> Stages:
        need(catalog, "drafter")
        return Stages(
            SlotPropose(self.slot_size, self.slot_threshold),
            SlotGate(self.token_threshold),
            Commit("block", self.block_size, order="slot"),
            SlotVerify(self.kv == "reuse"),
            roles=("drafter",),
        )


@dataclass(slots=True)
class StreamingParams:
    window: int = 6
    entropy_threshold: float = 0.4
    distance_penalty: float = 0.1

    def __post_init__(self):
        check_positive("window", self.window)
        check_non_negative("entropy_threshold", self.entropy_threshold)
        check_non_negative("distance_penalty", self.distance_penalty)

    def build(self, catalog: Catalog) -> Stages:
        need(catalog, "drafter")
        gate = EntropyWindow(self.entropy_threshold, self.distance_penalty)
        return Stages(CausalPropose(), gate, Commit("window", self.window), roles=("drafter",))


@dataclass(slots=True)
class PipelineParams:
    window: int = 16
    top_k_match: int = 1  # 2 trades accuracy for acceptance (003 Table 11)
    guidance_threshold: float = 0.5
    bonus_token: bool = True  # follow=guider: the guider's token at the first disagreement
    filter_threshold: float = 0.99  # 004's is 0.96: README, Strategies (measured against accuracy)
    follow: str = "drafter"
    frontier_head: str = "ar"
    overlap: bool = False  # draft the next window while the guider verifies this one (overlap.py)
    lookahead: int = 0  # follow=guider: the guider's own next tokens, decoded while the drafter drafts (lookahead.py)
    guesses: int = 1  # overlap, follow=drafter: the accepted counts the next window is drafted for (overlap.py)

    def __post_init__(self):
        check_positive("window", self.window)
        check_positive("top_k_match", self.top_k_match)
        check_non_negative("lookahead", self.lookahead)
        check_prob("guidance_threshold", self.guidance_threshold)
        check_prob("filter_threshold", self.filter_threshold)
        check_choice("follow", self.follow, FOLLOW)
        check_choice("frontier_head", self.frontier_head, FRONTIER_HEADS)
        if self.lookahead and (self.follow != "guider" or self.overlap):
            raise ValueError("lookahead needs follow=guider (the guider's tokens are the output) and overlap=false")
        check_positive("guesses", self.guesses)
        if self.guesses > 1 and (self.follow != "drafter" or not self.overlap):
            raise ValueError("guesses > 1 needs overlap=true and follow=drafter (a round accepts a count of drafts)")

    def build(self, catalog: Catalog) -> Stages:
        need(catalog, "drafter", "guider")
        check_filter_block(catalog, "causal", "window", self.window)
        gate = GuiderAgreement(
            self.top_k_match, self.guidance_threshold, self.bonus_token, self.filter_threshold, self.follow
        )
        commit = Commit("frontier", self.window)
        propose = CausalPropose(ar_head=self.frontier_head == "ar")
        verify = GuiderVerify(self.top_k_match, filter_drafter="causal")
        if self.lookahead:
            propose = GuiderLookahead(propose, self.lookahead)
        if self.overlap:
            post = PostVerify(propose, verify, commit, self.frontier_head == "ar", self.guesses)
            propose, verify = post.propose, post.verify
        return Stages(propose, gate, commit, verify, ("drafter", "guider"))


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
        try:
            values[key] = parse_value(kinds[key], raw)
        except ValueError as e:
            raise ValueError(f"parameter {key!r}: {e}") from None
    return cls(**values)


def defaults(strategy: str) -> dict[str, Any]:
    params = make_params(strategy)
    return {f.name: getattr(params, f.name) for f in fields(params)}


__all__ = ["STRATEGIES", "Stages", "make_params", "defaults", "Region"]
