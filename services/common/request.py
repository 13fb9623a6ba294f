"""One request's decode state: the generation canvas, what is decided, and the physical -> logical order."""

from dataclasses import dataclass, field

import torch

from services.common.proposal import TokenLogprob
from services.common.sampling import Rng, SamplingParams
from services.common.stats import Stats


@dataclass(slots=True)
class Request:
    id: str
    prompt_ids: list[int]
    max_new_tokens: int
    mask_id: int
    eos_id: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tokens: torch.Tensor = None  # [max_new_tokens] generation canvas, mask_id where undecided
    decided: torch.Tensor = None  # [max_new_tokens] bool, a decided token never changes
    filled: torch.Tensor = None  # [max_new_tokens] bool, a tentative draft kept as context, may be replaced
    committed: torch.Tensor = None  # [max_new_tokens] bool, in `order` (its KV belongs in the drafter cache)
    horizon: int = 0  # end of the canvas the models see; EOS truncation shrinks it (decode/commit.py)
    order: list[int] = field(default_factory=list)  # committed positions in physical (commit) order
    emitted: int = 0  # length of the contiguous prefix already streamed out
    finish_reason: str | None = None
    state: dict = field(default_factory=dict)  # strategy state (credits, slots in completion)
    stats: Stats = field(default_factory=Stats)
    rng: Rng = None  # its sampling randomness: the seed and the draws made
    logprobs: dict[int, TokenLogprob] = field(default_factory=dict)  # position -> its token's, when asked

    def __post_init__(self):
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if not self.prompt_ids:
            raise ValueError("prompt must not be empty")
        self.tokens = torch.full((self.max_new_tokens,), self.mask_id, dtype=torch.long)
        self.decided = torch.zeros(self.max_new_tokens, dtype=torch.bool)
        self.filled = torch.zeros(self.max_new_tokens, dtype=torch.bool)
        self.committed = torch.zeros(self.max_new_tokens, dtype=torch.bool)
        self.horizon = self.max_new_tokens
        self.rng = Rng(self.sampling.seed)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def frontier(self) -> int:
        """First undecided position: the decided prefix is [0, frontier)."""
        undecided = (~self.decided[: self.horizon]).nonzero()
        return int(undecided[0]) if len(undecided) else self.horizon

    @property
    def first_eos(self) -> int | None:
        """Position of the first decided EOS."""
        eos = (self.decided & (self.tokens == self.eos_id)).nonzero()
        return int(eos[0]) if len(eos) else None

    @property
    def end(self) -> int:
        """Logical end of the output: just past the first decided EOS, else the canvas end."""
        return self.end_after(self.first_eos)

    def end_after(self, eos: int | None) -> int:
        """end, given the first decided EOS's position (None: none decided) where the caller has it already."""
        return self.horizon if eos is None else min(self.horizon, eos + 1)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def physical_to_logical(self) -> list[int]:
        """Logical position ids of the drafter's cached sequence, prompt first then commits in commit order."""
        return list(range(self.prompt_len)) + [self.prompt_len + p for p in self.order]

    def decide(self, positions: torch.Tensor, ids: torch.Tensor) -> None:
        positions, ids = positions.cpu(), ids.cpu()
        assert not self.decided[positions].any(), "a decided token never changes"
        self.tokens[positions] = ids
        self.decided[positions] = True
        self.filled[positions] = False

    def fill(self, positions: torch.Tensor, ids: torch.Tensor) -> None:
        """Replace every tentative draft by these."""
        if len(positions) == 0 and not self.filled.any():  # the common case, in one op rather than four
            return
        self.tokens[self.filled] = self.mask_id
        self.filled[:] = False
        self.tokens[positions.cpu()] = ids.cpu()
        self.filled[positions.cpu()] = True

    def commit(self, positions: list[int]) -> None:
        """Append decided positions to the physical order, in the order given."""
        self.order.extend(positions)
        self.committed[positions] = True

    def context_positions(self) -> torch.Tensor:
        """Decided or filled positions not yet committed, in logical order: clean context that precedes masks."""
        known = (self.decided | self.filled) & ~self.committed
        known[self.horizon :] = False
        return known.nonzero().squeeze(-1)

    def output_ids(self) -> list[int]:
        """The decided prefix up to its first EOS, which is left out."""
        ids = self.tokens[: min(self.frontier, self.end)].tolist()
        return ids[:-1] if ids and ids[-1] == self.eos_id else ids
