"""In-process engine: loads the configured models once and decodes requests with any named strategy."""

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from services.ar_guider.guider import Guider
from services.common.config import EngineConfig
from services.common.models import LoadedModel, ModelMeta, load_model
from services.common.proposal import Committed
from services.common.request import Request
from services.common.sampling import SamplingParams
from services.dlm_drafter.bidirectional import BidirectionalDrafter, Smoothing
from services.dlm_drafter.causal import CausalDrafter
from services.dlm_drafter.serial import SerialBidirectionalDrafter
from services.filter.model import Learn2PDFilter
from services.orchestrator.loop import decode
from services.orchestrator.strategies import make_params


class ModelPool:
    """Loads each role's model on first use; hands out stage components around them."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.loaded: dict[str, LoadedModel] = {}
        self.filter_model: Learn2PDFilter | None = None

    def load(self, role: str) -> LoadedModel:
        if role not in self.loaded:
            reordered = role == "drafter"
            self.loaded[role] = load_model(self.config.path(role), self.config.device, self.config.dtype, reordered)
        return self.loaded[role]

    def drafter(self, family: str, cache: str = "none", smoothing: Smoothing | None = None, logits: bool = False):
        """logits: whether proposals must carry the full distribution (in process they always do)."""
        if family == "causal":
            return CausalDrafter(self.load("drafter"))
        return SerialBidirectionalDrafter(BidirectionalDrafter(self.load("drafter_bidirectional")), cache, smoothing)

    def guider(self) -> Guider:
        return Guider(self.load("guider"))

    def autoregressive(self, role: str) -> Guider:
        return Guider(self.load(role), role="guider" if role == "guider" else "drafter")

    def filter(self) -> Learn2PDFilter:
        if self.filter_model is None:
            self.filter_model = Learn2PDFilter.load(self.config.path("filter"))
        return self.filter_model

    def meta(self) -> ModelMeta:
        return self.load(first_role(self.config)).meta


def first_role(config: EngineConfig) -> str:
    """The model whose tokenizer the engine speaks: all roles share one tokenizer."""
    for role in ("drafter", "drafter_bidirectional", "guider", "ar"):
        if role in config.models:
            return role
    raise ValueError("config names no model (models.drafter, models.guider, ...)")


@dataclass(slots=True)
class Result:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: dict


class Engine:
    def __init__(self, config: EngineConfig, models=None):
        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        self.models = models or ModelPool(config)  # or a pool of remote stage components (services)
        self.ids = itertools.count()

    @property
    def tokenizer(self):
        return self.models.meta().tokenizer

    def encode(self, prompt: str) -> list[int]:
        tok = self.tokenizer
        if self.config.chat_template and getattr(tok, "chat_template", None):
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        return tok.encode(prompt, add_special_tokens=False)

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def request(
        self,
        prompt: str | list[int],
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> Request:
        base = self.models.meta()
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("prompt must not be empty")
        vocab = len(base.tokenizer)
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        max_new = max_new_tokens if max_new_tokens is not None else self.config.max_new_tokens
        if len(ids) >= base.max_length:
            raise ValueError(f"prompt has {len(ids)} tokens, over the model context of {base.max_length}")
        if max_new <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {max_new}")
        if len(ids) + max_new > base.max_length:
            raise ValueError(
                f"max_new_tokens {max_new} + prompt {len(ids)} exceeds the model context {base.max_length}"
            )
        mask_id = base.mask_id if base.mask_id is not None else -1
        rid = request_id or f"req-{next(self.ids)}"
        return Request(rid, ids, max_new, mask_id, base.eos_id, sampling or SamplingParams())

    def stream(self, req: Request, strategy: str | None = None, params: dict | None = None) -> Iterator[Committed]:
        name = strategy or self.config.strategy
        overrides = {**self.config.strategies.get(name, {}), **(params or {})}
        stages = make_params(name, overrides).build(self.models)
        return decode(req, stages)

    def generate(
        self,
        prompt: str | list[int],
        strategy: str | None = None,
        params: dict | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        on_commit: Callable[[Committed], None] | None = None,
    ) -> Result:
        req = self.request(prompt, max_new_tokens, sampling)
        for event in self.stream(req, strategy, params):
            if on_commit:
                on_commit(event)
        ids = req.output_ids()
        return Result(self.decode_text(ids), ids, req.finish_reason, req.stats.to_dict())
