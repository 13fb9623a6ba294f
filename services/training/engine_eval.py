"""`dlm eval`: exact-answer accuracy per task family on held-out items, the guider's NLL of the outputs, and the
engine's stats, for any strategy. The `code` suite continues held-out standard-library source (open-ended).
`baselines` names the decodes a strategy's accuracy and speed are weighed against."""

import math
import time

import torch

from services.common.contract import DrafterForward
from services.common.sampling import SamplingParams
from services.orchestrator.decode.strategies import make_params
from services.orchestrator.engine.engine import Engine
from services.training import corpus, tasks


def guider_nll(engine: Engine, prompt_ids: list[int], output_ids: list[int]) -> tuple[float, int]:
    """Sum of -log p(output | prompt) under the guider, and the number of tokens scored (EOS included)."""
    loaded = engine.executor.load("guider")
    ids = prompt_ids + output_ids + [loaded.eos_id]
    with torch.inference_mode():
        logits = loaded.model(input_ids=torch.tensor([ids], device=loaded.device)).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1)[len(prompt_ids) - 1 :]
    target = torch.tensor(ids[len(prompt_ids) :], device=logp.device)
    return float(-logp.gather(-1, target[:, None]).sum()), len(target)


def items(suite: str, n: int, seed: int, families: tuple[str, ...]) -> list[tuple[str, str, object]]:
    """(family, prompt, task or None) of the held-out split."""
    if suite == "tasks":
        return [(f, t.prompt, t) for f in families for t in tasks.generate(f, n, "heldout", seed)]
    if suite == "code":
        docs = corpus.load("heldout")[:n]
        return [("code", corpus.chunks(d.text, 400)[0], None) for d in docs]
    raise ValueError(f"suite must be tasks or code, got {suite!r}")


def baselines(strategy: str, params: dict | None = None) -> dict[str, tuple[str, dict]]:
    """name -> (strategy, params). A strategy following the guider is weighed against the guider alone. The others
    output their drafter's tokens: against the drafter's own decoding and ar-base, the same-size AR model (FlashDLM
    Table 4's comparison). The causal drafter decodes left to right, one token per forward, in two ways: from a
    clean token's output (ar model=drafter, its AR head) and from a mask's (streaming window=1, what 003 Alg. 1
    reduces to where nothing agrees); the bidirectional one with mdm and threshold."""
    chosen = make_params(strategy, params)
    if getattr(chosen, "follow", None) == "guider":
        return {"ar-guider": ("ar", {"model": "guider"})}
    if strategy == "ar":
        return {}
    if getattr(chosen, "drafter", "causal") == "causal":
        own = {"ar-drafter": ("ar", {"model": "drafter"}), "mask-drafter": ("streaming", {"window": 1})}
    else:
        own = {"mdm": ("mdm", {}), "threshold": ("threshold", {})}
    return own | {"ar-base": ("ar", {})}


def evaluate(
    engine: Engine,
    strategy: str | None = None,
    params: dict | None = None,
    suite: str = "tasks",
    n: int = 20,
    seed: int = 0,
    families: tuple[str, ...] = tasks.FAMILIES,
    max_new_tokens: int = 160,
    nll: bool = True,
) -> dict:
    """nll: score the outputs with the guider (needs models.guider)."""
    correct: dict[str, list[bool]] = {}
    nll_sum, nll_tokens, tokens, rounds, forwards, drafted, wall = 0.0, 0, 0, 0, 0, 0, 0.0
    for family, prompt, task in items(suite, n, seed, families):
        if task is not None:
            budget = min(max_new_tokens, len(engine.tokenizer.encode(task.response, add_special_tokens=False)) + 8)
            req = engine.request(prompt, budget, SamplingParams())
        else:  # open-ended: raw source, no chat template
            req = engine.request(engine.tokenizer.encode(prompt, add_special_tokens=False), 64, SamplingParams())
        start = time.perf_counter()
        for _ in engine.stream(req, strategy, params):
            pass
        wall += time.perf_counter() - start
        out = req.output_ids()
        if task is not None:
            correct.setdefault(family, []).append(tasks.check(task, engine.decode_text(out)))
        if nll:
            s, k = guider_nll(engine, req.prompt_ids, out)
            nll_sum, nll_tokens = nll_sum + s, nll_tokens + k
        tokens, rounds, forwards, drafted = (
            tokens + req.stats.tokens,
            rounds + req.stats.rounds,
            forwards + req.stats.model_forwards,
            drafted + req.stats.drafter_tokens_processed,
        )
    accuracy = {f: sum(v) / len(v) for f, v in correct.items()}
    return {
        "strategy": strategy or engine.config.strategy,
        "suite": suite,
        "n_per_family": n,
        "accuracy": accuracy,
        "overall_accuracy": sum(accuracy.values()) / len(accuracy) if accuracy else math.nan,
        "nll": nll_sum / nll_tokens if nll_tokens else math.nan,
        "stats": {
            "tokens": tokens,
            "rounds": rounds,
            "model_forwards": forwards,
            "tpf": tokens / max(rounds, 1),
            "tokens_per_forward": tokens / max(forwards, 1),
            "p_cache": tokens / drafted if drafted else 1.0,
            "tokens_per_s": tokens / wall if wall else 0.0,
            "wall_s": wall,
        },
    }


def mask_accuracy(engine: Engine, ratios=(0.25, 0.5, 0.75), n: int = 20, seed: int = 0) -> dict[str, float]:
    """The causal drafter's one-forward MDM accuracy on held-out task responses with a fraction of tokens masked:
    observed tokens stand before the masks (topological reordering), every prediction scored against the truth."""
    drafter = engine.executor.host("drafter")
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for ratio in ratios:
        right = total = 0
        for family in tasks.FAMILIES:
            for task in tasks.generate(family, n, "heldout", seed):
                truth = engine.tokenizer.encode(task.response, add_special_tokens=False)
                req = engine.request(task.prompt, len(truth), SamplingParams())
                masked = torch.rand(len(truth), generator=generator) < ratio
                masked[torch.randint(len(truth), (1,), generator=generator)] = True  # at least one
                seen, hidden = (~masked).nonzero().squeeze(-1), masked.nonzero().squeeze(-1)
                ids = torch.cat([torch.tensor(truth)[seen], torch.full((len(hidden),), req.mask_id)])
                args = DrafterForward(req, ids, torch.cat([seen, hidden]), None)
                logits = drafter.forward([args])[0].value[len(seen) :]
                right += int((logits.argmax(-1).cpu() == torch.tensor(truth)[hidden]).sum())
                total += len(hidden)
                drafter.release([req.id])
        out[str(ratio)] = right / total
    return out
