"""ReFusion slot decoding (000 §4.2, A.3): the slot gate on hand-built verdicts, and whole decodes on a scripted
causal drafter whose confidences put slots where the test wants them."""

import pytest
import torch

from services.common.proposal import Region, Verdict
from services.common.request import Request
from services.orchestrator.decode.slots import SlotGate, SlotWork
from tests.scripted import ScriptedLM, confident, row, scripted_engine

MASK, EOS = 1, 0
TAU = 0.4


def slot_request(work: SlotWork) -> Request:
    req = Request("r", [5, 6, 7], 16, MASK, EOS)
    req.state["slots"] = work
    return req


def slot_verdict(work: SlotWork, draft_probs: list[float], target: list[int] | None = None) -> Verdict:
    draft = torch.cat(work.drafts)
    target = torch.tensor(target) if target is not None else draft
    probs = torch.tensor(draft_probs)
    return Verdict(work.positions(), draft, target, target[:, None], probs, probs)


def two_slots(valid=(0, 0), completing=False) -> SlotWork:
    drafts = [torch.tensor([20, 21, 22, 23]), torch.tensor([28, 29, 30, 31])]
    return SlotWork([0, 8], drafts, [0.95, 0.95], list(valid), completing)


def test_select_round_accepts_the_whole_slots_the_verified_prefix_covers():
    work = two_slots()
    req = slot_request(work)
    decision = SlotGate(TAU)(req, Region(0, 16), None, slot_verdict(work, [0.9] * 8))
    assert decision.positions.tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert decision.ids.tolist() == [20, 21, 22, 23, 28, 29, 30, 31]
    assert req.state["slots"] is None


def test_select_round_remasks_a_partly_verified_slot():
    work = two_slots()
    req = slot_request(work)
    probs = [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, TAU, 0.9]  # at tau_token is not above it
    decision = SlotGate(TAU)(req, Region(0, 16), None, slot_verdict(work, probs))
    assert decision.positions.tolist() == [0, 1, 2, 3]
    assert req.state["slots"] is None  # the second slot is drafted again in the next select round


def test_select_round_without_a_whole_slot_enters_completion_keeping_the_first_prefix():
    work = two_slots()
    req = slot_request(work)
    decision = SlotGate(TAU)(req, Region(0, 16), None, slot_verdict(work, [0.9, 0.9, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9]))
    assert decision.positions.tolist() == []
    assert work.completing and work.fresh and work.valid == [2, 0]


def test_completion_extends_the_verified_prefix_without_recounting_it():
    """000 Eq. 8: a prefix once verified stays; a forced or mask-predicted first token below tau_token does not
    hold the slot back in later iterations. A slot complete before the others waits for them (000 §4.2)."""
    work = two_slots(valid=(1, 0), completing=True)
    req = slot_request(work)
    probs = [0.3, 0.9, 0.9, 0.9] + [0.9, 0.9, 0.2, 0.9]
    decision = SlotGate(TAU)(req, Region(0, 16), None, slot_verdict(work, probs))
    assert decision.positions.tolist() == []
    rest: SlotWork = req.state["slots"]
    assert rest.starts == [0, 8] and rest.valid == [4, 2] and rest.completing
    assert rest.drafts[1].tolist() == [28, 29, 30, 31]
    decision = SlotGate(TAU)(req, Region(0, 16), None, slot_verdict(work, [0.3, 0.9, 0.9, 0.9] + [0.9] * 4))
    assert decision.positions.tolist() == [0, 1, 2, 3, 8, 9, 10, 11] and req.state["slots"] is None


def test_completion_without_progress_takes_the_drafters_own_next_token():
    work = SlotWork([4], [torch.tensor([20, 21, 22, 23])], [0.95], [2], completing=True)
    req = slot_request(work)
    decision = SlotGate(TAU)(req, Region(0, 16), None, slot_verdict(work, [0.9, 0.9, 0.1, 0.9], [20, 21, 40, 41]))
    assert decision.positions.tolist() == []
    assert work.valid == [3] and work.drafts[0].tolist() == [20, 21, 40, 23]
    assert req.state["slots"].valid == [3]


# ---------------------------------------------------------------- whole decodes on a scripted causal drafter

PROMPT = [5, 6, 7]
TOKENS = list(range(10, 26))  # 16 tokens, no EOS
SLOT = {"slot_size": 8, "block_size": 16, "slot_threshold": 0.9, "token_threshold": TAU}


def slot_decode(script: dict) -> tuple[list[int], dict]:
    engine = scripted_engine({"drafter": ScriptedLM(script, len(PROMPT))}, 16)
    result = engine.generate(PROMPT, "slot", SLOT)
    return result.token_ids, result.stats


def test_confident_slots_are_selected_together_and_accepted_in_one_round():
    ids, stats = slot_decode(confident(TOKENS))
    assert ids == TOKENS
    assert stats["rounds"] == 1 and stats["drafter_forwards"] == 2  # draft + verify


def test_an_uncertain_first_token_does_not_stall_completion():
    """The first token (p 0.3 <= tau_token) is selected by the fallback and forced once; the rest of the slot is
    confident, so completion ends in the next iteration. Recounting from the first token stalled here: one forced
    token per round, 19 drafter forwards for 16 tokens."""
    script = confident(TOKENS)
    script[0] = row({TOKENS[0]: 0.3, 2: 0.25})
    ids, stats = slot_decode(script)
    assert ids == TOKENS
    # round 1: slot 8 (the only one above tau_slot) whole; round 2: slot 0 by fallback, verified prefix 0 ->
    # completion; round 3: isolated verification forces token 0; round 4: re-predict 1..7, verified to the end
    assert stats["rounds"] == 4 and stats["drafter_forwards"] == 7 < stats["tokens"]


def test_a_weak_token_inside_the_second_slot_remasks_it_and_completes_it_alone():
    script = confident(TOKENS)
    script[12] = row({TOKENS[12]: 0.3, 2: 0.25})
    engine = scripted_engine({"drafter": ScriptedLM(script, len(PROMPT))}, 16)
    req = engine.request(PROMPT)
    events = list(engine.stream(req, "slot", SLOT))
    assert req.output_ids() == TOKENS
    assert [len(e.ids) for e in events] == [8, 0, 0, 8]  # slot 0 whole in round 1; slot 8 after completion
    assert req.stats.accepted == [8, 0, 0, 8]


def test_completing_slots_are_predicted_in_isolation():
    """000 Eq. 9: each selected slot re-predicts its suffix from the context and its own prefix only."""
    script = confident(TOKENS)
    script[3] = row({TOKENS[3]: 0.3, 2: 0.25})  # both slots are selected; both fail verification inside
    script[11] = row({TOKENS[11]: 0.3, 2: 0.25})
    model = ScriptedLM(script, len(PROMPT))
    engine = scripted_engine({"drafter": model}, 16)
    assert engine.generate(PROMPT, "slot", SLOT).token_ids == TOKENS
    infills = [segs[0].mask == 0 for ids, segs in model.calls if (ids == MASK).any() and segs[0].mask is not None]
    assert infills, "completion re-predicts the slots in one forward with a per-slot attention mask"
    two_slots_together = infills[0]  # the request's [Q, past + Q]
    q = two_slots_together.shape[0]
    new = two_slots_together[:, -q:]
    assert not new.tril().equal(torch.ones(q, q, dtype=torch.bool).tril())  # some earlier token is hidden


# ---------------------------------------------------------------- against 000 A.3, written out


def refusion(script: dict, n: int, k: int, b: int, tau_slot: float, tau_token: float) -> tuple[list, list, int]:
    """000 §4.2 / A.3 greedy on a script whose distribution at a position ignores the context, so that Eq. 6-9 read
    the same probabilities whatever they condition on -> output, tokens decided per engine round, drafter forwards.

    A select round drafts the block's masked slots (Stage I, one forward), selects those whose first token is above
    tau_slot (else the best), verifies them concatenated (Eq. 7, one forward) and accepts the whole slots inside the
    verified prefix. Else parallel iterative completion: per iteration each slot is verified alone (Eq. 8: its
    verified prefix stays; the first slot's, verified by Eq. 7 already, counts) and the unfinished suffixes are
    re-predicted (Eq. 9) before the next; one round per iteration, the first without the prediction forward. A slot
    whose prefix did not grow takes the drafter's own next token (the README's stated interpretation). The slots are
    committed together once all are complete."""
    prob = {q: float(script[q].exp().max()) for q in range(n)}
    token = {q: int(script[q].argmax()) for q in range(n)}
    tokens, rounds, forwards = {}, [], 0
    while len(tokens) < n:
        lo = min(set(range(n)) - set(tokens)) // b * b
        hi = min(lo + b, n)
        slots = {s: list(range(s, min(s + k, hi))) for s in range(lo, hi, k) if s not in tokens}
        selected = [s for s in slots if prob[s] > tau_slot] or [max(slots, key=prob.get)]
        forwards += 2
        concatenated = [q for s in selected for q in slots[s]]
        verified = next((i for i, q in enumerate(concatenated) if prob[q] <= tau_token), len(concatenated))
        whole = [s for s in selected if slots[s][-1] in concatenated[:verified]]
        if not whole:
            rounds.append(0)
            valid = dict.fromkeys(selected, 0)
            valid[selected[0]] = min(verified, len(slots[selected[0]]))
            while True:
                forwards += 1
                for s in selected:
                    rest = slots[s][valid[s] :]
                    if rest:
                        valid[s] += next((i for i, q in enumerate(rest) if prob[q] <= tau_token), len(rest)) or 1
                if all(valid[s] == len(slots[s]) for s in selected):
                    break
                rounds.append(0)
                forwards += 1
            whole = selected
        tokens |= {q: token[q] for s in whole for q in slots[s]}
        rounds.append(sum(len(slots[s]) for s in whole))
    return [tokens[q] for q in range(n)], rounds, forwards


def slot_run(model: ScriptedLM, n: int, params: dict) -> Request:
    engine = scripted_engine({"drafter": model}, n)
    req = engine.request(PROMPT, n)
    list(engine.stream(req, "slot", params))
    return req


def weak(script: dict, *positions: int, p: float = 0.3) -> dict:
    for q in positions:
        script[q] = row({TOKENS[q]: p})
    return script


LAST_ONLY = {
    "alone": weak(weak(confident(TOKENS), 7), 8, p=0.8),  # slot 0 selected alone (slot 8's first token 0.8)
    "second": weak(confident(TOKENS), 15),  # both selected: slot 0 whole, then slot 8 alone
}


@pytest.mark.parametrize("name", sorted(LAST_ONLY))
def test_a_slot_whose_only_failing_token_is_its_last_completes_as_refusion_does(name):
    script = LAST_ONLY[name]
    req = slot_run(ScriptedLM(script, len(PROMPT)), 16, SLOT)
    reference, rounds, forwards = refusion(script, 16, 8, 16, 0.9, TAU)
    assert req.output_ids() == reference == TOKENS
    assert req.stats.accepted == rounds and req.stats.drafter_forwards == forwards


def seen_by(model: ScriptedLM, forward: int, positions: set[int]) -> set[int]:
    """The generation positions that forward's queries at `positions` attend to: its cache, and its new tokens
    where the request's attention mask lets them."""
    _, segments = model.calls[forward]
    inputs, cached = model.positions[forward]
    keys = [p - len(PROMPT) for p in cached + inputs]
    rows = [i for i, p in enumerate(inputs) if p - len(PROMPT) in positions]
    return {keys[j] for i in rows for j in (segments[0].mask[i] == 0).nonzero().squeeze(-1).tolist()}


@pytest.mark.parametrize("kv", ["reuse", "recompute"])
def test_a_slot_complete_early_waits_for_its_rounds_slots(kv):
    """Slots 0 and 4 are selected together; slot 0 completes in the second iteration, slot 4 in the fourth. Slot 0
    waits: it is committed with slot 4, and slot 4's completion never sees it (000 §4.2)."""
    script = weak(confident(TOKENS[:8]), 1, 5, 6)
    model = ScriptedLM(script, len(PROMPT))
    params = {"slot_size": 4, "block_size": 8, "slot_threshold": 0.9, "token_threshold": TAU, "kv": kv}
    req = slot_run(model, 8, params)
    reference, rounds, forwards = refusion(script, 8, 4, 8, 0.9, TAU)
    assert rounds == [0, 0, 0, 0, 8]
    assert req.output_ids() == reference and req.stats.accepted == rounds
    assert req.stats.drafter_forwards == forwards == len(model.calls)
    completion = range(2, forwards)  # the select round's draft and verification come first
    assert all(not seen_by(model, f, {4, 5, 6, 7}) & {0, 1, 2, 3} for f in completion)
