"""The OpenAI API's request and response bodies (the subset users send, as vLLM serves it), with our extension
fields: `strategy` and `dlm_params` in a request, `seed` and `dlm_stats` in a response."""

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MODEL_ID = "dlm"


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """Fields both endpoints take; unknown ones are kept in model_extra, and ignored with a warning as vLLM does."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, gt=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)  # vLLM's extension; 0: off
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)  # one choice per request
    user: str | None = None
    strategy: str | None = None  # a decode strategy (GET /v1/models lists them); None: the server's default
    dlm_params: dict[str, Any] = Field(default_factory=dict)  # the strategy's parameters

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] = Field(min_length=1)  # decoded as is: no chat template
    logprobs: int | None = Field(None, ge=0)  # top alternatives per token
    echo: Literal[False] = False


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, gt=0)  # the newer name of max_tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    ).model_dump()


def error(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def now() -> int:
    return int(time.time())
