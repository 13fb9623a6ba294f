"""The engine-host contract: the roles a step can call, what each model host's methods take and return, and the
executor that carries a step's calls to the hosts.

A decode stage (services/orchestrator/decode) yields `Call`s: a role and one request's typed arguments. The engine
groups a step's calls by (role, method) and hands the groups to its `Executor`, which runs each group as one batched
call of that role's host: in process (orchestrator/engine/local_executor.py) or on the host's Ray Serve replicas
(orchestrator/cluster/remote_executor.py). A host method takes the list of every request's arguments and returns one
`Reply` per request, in order. The role table below is the one place that says which host serves a role, whether it
keeps per-request KV, and which counter of a request's stats its calls feed.
"""

from collections.abc import Awaitable, Generator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from services.common.models import ModelMeta
from services.common.placement import Placement
from services.common.proposal import Proposal, Region
from services.common.request import Request

T = TypeVar("T")


class Role(StrEnum):
    DRAFTER = "drafter"  # the diffusion drafters: causal (models.drafter), bidirectional (drafter_bidirectional)
    DRAFTER_AR = "drafter_ar"  # the causal drafter decoding left to right, as an AR model (in process only)
    GUIDER = "guider"
    AR = "ar"  # the same-size AR baseline
    FILTER = "filter"  # the Learn2PD filters of both drafter families


@dataclass(frozen=True, slots=True)
class RoleSpec:
    host: str  # the host that runs the role's calls; served, also its Serve deployment's name unless colocated
    model: str  # the config's models key whose weights its host loads
    holds_kv: bool  # keeps per-request KV between calls: placed on one replica, released when the request ends
    counter: str  # the RequestStats field each of its calls counts


ROLES = {
    Role.DRAFTER: RoleSpec("drafter", "drafter", True, "drafter_forwards"),
    Role.DRAFTER_AR: RoleSpec("drafter_ar", "drafter", True, "drafter_forwards"),
    Role.GUIDER: RoleSpec("guider", "guider", True, "guider_forwards"),
    Role.AR: RoleSpec("ar", "ar", True, "drafter_forwards"),
    Role.FILTER: RoleSpec("filter", "filter", False, "filter_calls"),
}
SERVED = (Role.DRAFTER, Role.GUIDER, Role.AR, Role.FILTER)  # roles whose hosts run on model replicas when served
FAMILIES = ("causal", "bidirectional")  # drafter families; each has its own filter
FILTER_MODELS = {"causal": "filter", "bidirectional": "filter_bidirectional"}  # family -> models key
MODEL_HOSTS = {"drafter_bidirectional": "drafter", "filter_bidirectional": "filter"}  # models key -> host serving it
CACHE_MODES = ("none", "prefix", "dual", "freecache", "vicinity")  # the bidirectional drafter's KV cache modes


def host_of(model: str) -> str:
    """The host that loads a config models key."""
    return MODEL_HOSTS.get(model, model)


def served_hosts(models: dict[str, str]) -> list[str]:
    """Hosts a config's models need served, in role order."""
    served = {host_of(m) for m in models}
    return [ROLES[r].host for r in SERVED if ROLES[r].host in served]


def kv_hosts(models: dict[str, str]) -> list[str]:
    """Hosts that keep per-request KV for a config's models, in role order."""
    return [host for host in served_hosts(models) if ROLES[Role(host)].holds_kv]


@dataclass(slots=True)
class Smoothing:
    """dInfer's iteration smoothing (001 A.1): weight of the last forward's expected embedding in masked inputs."""

    alpha_init: float = 0.1
    alpha_growth: float = 0.05
    alpha_max: float = 0.3  # dInfer App. D cont_weight

    def alpha(self, step: int) -> float:
        return min(self.alpha_init + self.alpha_growth * step, self.alpha_max)


@dataclass(frozen=True, slots=True)
class Vicinity:
    """The vicinity cache mode's settings (001 App. D: prefix look and after look 16, warmup_times 4)."""

    prefix_look: int = 16
    after_look: int = 16
    warmup_times: int = 4


# One request's arguments per host method. `method` names the host method; the reply's value is in each docstring.


@dataclass(frozen=True, slots=True)
class Propose:
    """Drafter: fill the region's masks with the causal drafter, one forward. -> Proposal"""

    method: ClassVar[str] = "propose"
    req: Request
    region: Region
    keep_logits: bool = False  # the full distribution comes back only for gates that fuse it (credit)
    ar_head: bool = False  # the first mask drafted by the clean token before it (causal.py, propose_batch)


@dataclass(frozen=True, slots=True)
class ProposeAfter:
    """Drafter: the next round's proposal for each of several counts of this round's drafts accepted (overlap's
    guesses, decode/overlap.py), in one forward: each guess's accepted drafts and next window's masks in a span of
    their own, seeing the cache and themselves, as the propose call of the request with those drafts committed would
    see them. -> Guessed"""

    method: ClassVar[str] = "propose_after"
    req: Request
    start: int  # the request's frontier, where the drafts begin
    drafts: torch.Tensor  # [L] this round's drafts at start, start + 1, ...
    counts: tuple[int, ...]  # the accepted counts guessed, each in 1..L
    ends: tuple[int, ...]  # each guess's next region end: its masks are count + start .. end - 1
    ar_head: bool = False  # as Propose's: each guess's first mask drafted by its last accepted draft's output


@dataclass(slots=True)
class Guessed:
    """ProposeAfter's reply value: one proposal per guessed count, in order, each drawn from its own copy of the
    request's RNG, as the next round's proposal would be."""

    proposals: list[Proposal]
    draws: int  # the request's count of draws (Rng.draws) once the next round takes any one of them


@dataclass(frozen=True, slots=True)
class ProposeBidirectional:
    """Drafter: fill the region's masks with the bidirectional drafter under a cache mode. -> Proposal"""

    method: ClassVar[str] = "propose_bidirectional"
    req: Request
    region: Region
    cache: str  # one of CACHE_MODES
    vicinity: Vicinity = Vicinity()  # read by cache "vicinity" only
    smoothing: Smoothing | None = None
    keep_logits: bool = False


@dataclass(frozen=True, slots=True)
class DrafterForward:
    """Drafter: the causal drafter over explicit tokens, in process (training/engine_eval.py). -> logits [n, V]"""

    method: ClassVar[str] = "forward"
    req: Request
    ids: torch.Tensor  # [n] tokens
    positions: torch.Tensor  # [n] their logical positions
    groups: torch.Tensor | None  # [n] slot of each token: tokens attend only within their slot; None: all causal


@dataclass(frozen=True, slots=True)
class FillMasks:
    """Drafter: the causal drafter over explicit tokens, and its proposal for those that are the mask, chosen on the
    host (slot completion, 000 §4.2 Eq. 8-9). -> Proposal, without its logits"""

    method: ClassVar[str] = "fill_masks"
    req: Request
    ids: torch.Tensor  # [n] tokens, the mask where one is to be drafted
    positions: torch.Tensor  # [n] their logical positions
    groups: torch.Tensor  # [n] slot of each token: tokens attend only within their slot


@dataclass(frozen=True, slots=True)
class ScoreDraft:
    """Drafter: the causal drafter over a draft, read as a verifier reads it: token j + 1 under the output at token j
    (slot verification, 000 §4.2 Eq. 7). -> Verdict of draft[1:], its logprobs when the request asks"""

    method: ClassVar[str] = "score_draft"
    req: Request
    draft: torch.Tensor  # [n] tokens
    positions: torch.Tensor  # [n] their logical positions
    groups: torch.Tensor | None  # [n] slot of each token, each slot isolated; None: all causal
    stage_kv: bool = False  # keep this forward's KV on the replica for the commits its round makes


@dataclass(frozen=True, slots=True)
class Verify:
    """Guider: check a draft from `start` in one forward. -> Verdict"""

    method: ClassVar[str] = "verify"
    req: Request
    start: int  # the request's frontier
    draft: torch.Tensor  # [M] tokens from start to the region's end
    top_k: int


@dataclass(frozen=True, slots=True)
class NextToken:
    """Guider, AR baseline or drafter_ar: the token after the request's decided prefix, chosen on the host from its
    logits (a sampled one is a draw of the request's RNG), as plain AR decoding takes it. -> Proposal of position
    `start`, without its logits"""

    method: ClassVar[str] = "next_token"
    req: Request
    start: int  # the request's frontier


@dataclass(frozen=True, slots=True)
class Lookahead:
    """Guider: its own greedy tokens from `start` while the drafter drafts, one forward each, as it decodes alone.
    -> ids [<= k], ending early at an EOS"""

    method: ClassVar[str] = "lookahead"
    req: Request
    start: int  # the request's frontier
    k: int


@dataclass(frozen=True, slots=True)
class AcceptProbs:
    """Filter: Learn2PD accept scores of a block's confidences (004 Alg. 2). -> scores [n]"""

    method: ClassVar[str] = "accept_probs"
    family: str  # the proposing drafter's family (FAMILIES): its own filter scores it
    confidence: torch.Tensor  # [n]


Args = (
    Propose
    | ProposeAfter
    | ProposeBidirectional
    | DrafterForward
    | FillMasks
    | ScoreDraft
    | Verify
    | NextToken
    | Lookahead
    | AcceptProbs
)


@dataclass(frozen=True, slots=True)
class Call:
    role: Role
    args: Args

    @property
    def method(self) -> str:
        return self.args.method


@dataclass(frozen=True, slots=True)
class Compute:
    """One batched host call where it ran (services/common/compute.py): the host, its wall-clock start and end
    (time.time(): one clock for every process of a machine), the model FLOPs and decoder tokens of its forwards,
    when the host's thread ended its previous call (a call sent before then waited for it: served, another engine's),
    and the CPU time of the host's thread over the call. A forward on one thread (a CPU replica's) is on a core for
    its `cpu` and waits for one the rest of end - start.
    """

    host: str
    start: float
    end: float
    flops: int
    tokens: int
    free_since: float = 0.0
    cpu: float = 0.0


@dataclass(slots=True)
class Reply:
    value: Any
    tokens: int = 0  # token instances the call ran through the model for this request (p_cache's N_fwd)
    draws: int | None = None  # the request's count of draws after the call, where its host samples (Rng.draws)
    compute: Compute | None = None  # the batched call it came from, shared by every reply of that call
    forwards: int = 1  # the model's forwards it ran for this request (a lookahead runs several)


Stage = Generator[list[Call], list[Any], T]  # yields calls, receives their values in order, returns T


Key = tuple[Role, str]  # (role, method)
Groups = dict[Key, list[Args]]  # each group's arguments, one per call, in order
Results = dict[Key, list[Reply] | BaseException]  # each group's replies in the same order, or why it failed
Parents = dict[Key, list[str]] | None  # per group, each call's round traceparent; None: untraced


class DrafterHost(Protocol):
    def propose(self, calls: list[Propose]) -> list[Reply]:
        """Every request's causal proposal in one batched forward; the drafter keeps each request's exact KV
        (committed tokens physically first, with their logical positions)."""

    def propose_after(self, calls: list[ProposeAfter]) -> list[Reply]:
        """Every request's guessed next proposals in one batched forward; only the KV of its commits stays cached."""

    def propose_bidirectional(self, calls: list[ProposeBidirectional]) -> list[Reply]:
        """Every request's bidirectional proposal, with each request's block cache kept on the host."""

    def forward(self, calls: list[DrafterForward]) -> list[Reply]:
        """Forwards over explicit tokens on the causal drafter, their logits whole (in process)."""

    def fill_masks(self, calls: list[FillMasks]) -> list[Reply]:
        """Slot completion: each request's masks drafted in one batched forward, sampled on the host."""

    def score_draft(self, calls: list[ScoreDraft]) -> list[Reply]:
        """Slot verification: each request's draft read by the drafter in one batched forward."""


class ARHost(Protocol):
    def verify(self, calls: list[Verify]) -> list[Reply]:
        """Every request's draft checked by the guider in one forward over its cached prefix."""

    def next_token(self, calls: list[NextToken]) -> list[Reply]:
        """Each request's next token in one batched forward over its cached prefix, sampled where it samples."""

    def lookahead(self, calls: list[Lookahead]) -> list[Reply]:
        """Each request's next greedy tokens, batched over the requests one forward at a time."""


class FilterHost(Protocol):
    def accept_probs(self, calls: list[AcceptProbs]) -> list[Reply]:
        """Each block's accept scores from its drafter family's filter; families are scored apart."""

    def block_sizes(self) -> dict[str, int]:
        """Drafter family -> the block its filter reads."""


class CheckedHost(Protocol):
    """Every host."""

    def check_health(self) -> None:
        """Raise unless the host's models can run (its replica's Serve health check)."""


class KVHost(Protocol):
    def release(self, request_ids: list[str]) -> None:
        """Free the KV of ended requests; unknown ids are ignored."""

    def held(self) -> dict[str, int]:
        """Request id -> KV tokens cached for it now."""


class Executor(Protocol):
    """Runs a step's call groups on the hosts. One implementation in process, one over Ray Serve."""

    placement: Placement  # the KV ledger: the scheduler reserves each request's room in it, calls are routed by it
    roles: frozenset[str]  # models keys it serves (drafter_ar too, where the causal drafter decodes AR in process)
    resuming: set[str]  # requests waiting for a replica after theirs was lost (always empty in process)

    async def start(self) -> None:
        """Every host ready (models loaded, deployments healthy); before the first step."""

    def execute(self, groups: Groups, parents: Parents = None) -> Awaitable[Results]:
        """Each group as one batched host call, all of them at once; a failed group fails only its requests. The
        calls are on their way when this returns (on the executor's thread, or written to the replicas): nothing
        else the event loop runs first delays a phase."""

    def release(self, host: str, request_ids: list[str]) -> None:
        """Free ended requests' KV on the host that holds it; nothing waits on it."""

    def meta(self) -> ModelMeta:
        """The tokenizer, mask and EOS ids and context length every role shares."""

    def filter_block_size(self, family: str) -> int:
        """The block the family's filter reads; ValueError where no such filter is served."""
