"""Gates on hand-built proposals and verdicts, against plain re-implementations of the papers' rules."""

import math

import pytest
import torch

from services.common.proposal import Proposal, Region, TokenLogprobs, Verdict
from services.common.request import Request
from services.common.sampling import SamplingParams
from services.orchestrator.decode.gate import (
    AcceptAll,
    Credit,
    EntropyWindow,
    FilterGate,
    GuiderAgreement,
    Hierarchical,
    Threshold,
    TopN,
    block_state,
    pick,
    spans,
)
from tests.scripted import draw_generators

MASK, EOS = 1, 0


def request(n: int = 32) -> Request:
    return Request("r", [5, 6, 7], n, MASK, EOS)


def proposal(positions, probs, ids=None, entropy=None, logits=None) -> Proposal:
    positions = torch.tensor(positions)
    ids = torch.tensor(ids) if ids is not None else positions + 10
    entropy = torch.tensor(entropy) if entropy is not None else torch.zeros(len(positions))
    return Proposal(positions, ids, torch.tensor(probs), entropy, logits)


def decided(decision) -> list[int]:
    return decision.positions.tolist()


# ---------------------------------------------------------------- pick, block state, spans, accept-all


def test_pick_keeps_the_accepted_and_falls_back_to_the_best_score():
    prop = proposal([3, 4, 5], [0.2, 0.9, 0.4])
    decision = pick(prop, torch.tensor([True, False, True]), prop.probs)
    assert decided(decision) == [3, 5] and decision.ids.tolist() == [13, 15]
    fallback = pick(prop, torch.zeros(3, dtype=torch.bool), torch.tensor([0.1, 0.0, 0.3]))
    assert decided(fallback) == [5] and fallback.ids.tolist() == [15]  # the best score, not the best probability


def test_block_state_lives_as_long_as_its_block():
    req = request()
    first = block_state(req, "k", Region(0, 8), lambda: [0])
    first[0] = 5
    assert block_state(req, "k", Region(0, 8), lambda: [0]) == [5]
    assert block_state(req, "k", Region(8, 16), lambda: [0]) == [0]


def test_spans_group_consecutive_positions():
    groups = spans(torch.tensor([0, 1, 2, 5, 6, 9]))
    assert [g.tolist() for g in groups] == [[0, 1, 2], [3, 4], [5]]
    assert spans(torch.empty(0, dtype=torch.long)) == []


def test_accept_all():
    decision = AcceptAll()(request(), Region(0, 4), proposal([0, 2], [0.1, 0.2]), None)
    assert decided(decision) == [0, 2] and decision.ids.tolist() == [10, 12]


# ---------------------------------------------------------------- threshold (Fast-dLLM 001 §2.2)


def test_threshold_accepts_strictly_above_and_else_the_most_confident():
    gate = Threshold(0.9)
    prop = proposal([0, 1, 2, 3], [0.95, 0.9, 0.3, 0.99])
    assert decided(gate(request(), Region(0, 4), prop, None)) == [0, 3]
    low = proposal([0, 1, 2], [0.5, 0.8, 0.3])
    assert decided(gate(request(), Region(0, 4), low, None)) == [1]


# ---------------------------------------------------------------- TopN (LLaDA low-confidence remasking)


def llada_transfer_counts(masked: int, steps: int) -> list[int]:
    """LLaDA's get_num_transfer_tokens: masked // steps per step, the remainder on the first steps."""
    return [masked // steps + (1 if i < masked % steps else 0) for i in range(steps)]


@pytest.mark.parametrize("masked,steps", [(8, 4), (7, 3), (5, 5), (9, 2), (3, 1)])
def test_topn_follows_llada_schedule_most_confident_first(masked, steps):
    gate, req, region = TopN(steps), request(), Region(0, masked)
    g = torch.Generator().manual_seed(masked * 10 + steps)
    remaining = list(range(masked))
    counts = []
    while remaining:
        probs = torch.rand(len(remaining), generator=g)
        decision = gate(req, region, proposal(remaining, probs.tolist()), None)
        expected = sorted(torch.tensor(remaining)[probs.topk(len(decision.positions)).indices].tolist())
        assert sorted(decided(decision)) == expected
        counts.append(len(decision.positions))
        remaining = [p for p in remaining if p not in decided(decision)]
    assert counts == llada_transfer_counts(masked, steps)


def test_topn_restarts_its_schedule_in_each_block():
    gate, req = TopN(2), request()
    assert len(gate(req, Region(0, 4), proposal([0, 1, 2, 3], [0.5] * 4), None).positions) == 2
    assert len(gate(req, Region(4, 8), proposal([4, 5, 6, 7], [0.5] * 4), None).positions) == 2
    assert len(gate(req, Region(4, 8), proposal([5, 7], [0.5] * 2), None).positions) == 2


def test_topn_past_its_steps_decides_everything_left():
    gate, req = TopN(1), request()
    gate(req, Region(0, 4), proposal([0, 1, 2, 3], [0.5] * 4), None)
    assert len(gate(req, Region(0, 4), proposal([1, 2], [0.5] * 2), None).positions) == 2


# ---------------------------------------------------------------- credit (001 B.2)


class CreditReference:
    """001 B.2 Eq. 1-2 per position: C_v <- beta C_v (+ p^gamma for v = argmax p); p~ = softmax(z + alpha log(1+C))."""

    def __init__(self, vocab: int, beta: float, gamma: float, alpha: float):
        self.credit: dict[int, torch.Tensor] = {}
        self.vocab, self.beta, self.gamma, self.alpha = vocab, beta, gamma, alpha

    def fused(self, position: int, logits: torch.Tensor) -> torch.Tensor:
        c = self.credit.setdefault(position, torch.zeros(self.vocab))
        p = torch.softmax(logits, -1)
        c *= self.beta
        c[p.argmax()] += p.max() ** self.gamma
        return torch.softmax(logits + self.alpha * torch.log(1 + c), -1)


RAW_MASK_LOGIT = 4.0  # above every token's in these tests: a gate that did not ban the mask token would choose it


def drafted(logits: torch.Tensor) -> torch.Tensor:
    """A drafter's logits [N, V] over these tokens -> [N, V + 1], the mask token's column (id V) last, unbanned."""
    return torch.cat([logits, torch.full((len(logits), 1), RAW_MASK_LOGIT)], -1)


def credit_request(vocab: int, n: int = 32, sampling: SamplingParams | None = None) -> Request:
    """A request whose mask token is the column drafted() appends to a vocabulary of `vocab`."""
    return Request("r", [5, 6, 7], n, vocab, EOS, sampling or SamplingParams())


def test_credit_matches_the_reference_round_by_round():
    vocab, params = 6, (0.8, 0.5, 1.5)
    gate, ref, req, region = Credit(0.9, *params), CreditReference(vocab, *params), credit_request(vocab), Region(0, 4)
    base = torch.tensor(
        [
            [3.0, 1.0, 0.5, 0.0, 0.0, 0.0],  # a steady favourite below the threshold: credit lifts it
            [1.0, 1.2, 0.0, 0.0, 0.0, 0.0],  # two close candidates
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # flat: never decided by credit alone
            [0.0, 0.0, 2.5, 0.0, 0.0, 0.0],
        ]
    )
    remaining, rounds = [0, 1, 2, 3], 0
    while remaining and rounds < 6:
        logits = base[remaining]
        probs = torch.softmax(logits, -1)
        conf, ids = probs.max(-1)
        prop = Proposal(torch.tensor(remaining), ids, conf, torch.zeros(len(remaining)), drafted(logits))
        decision = gate(req, region, prop, None)
        fused = torch.stack([ref.fused(p, z) for p, z in zip(remaining, logits, strict=True)])
        f_conf, f_ids = fused.max(-1)
        accept = f_conf > 0.9
        if not accept.any():
            accept[f_conf.argmax()] = True
        assert decided(decision) == torch.tensor(remaining)[accept].tolist()
        assert decision.ids.tolist() == f_ids[accept].tolist()
        remaining = [p for p in remaining if p not in decided(decision)]
        rounds += 1
    assert rounds >= 2  # credit had to accumulate over rounds


def test_credit_fusion_lifts_steady_tokens_over_the_threshold():
    logits = torch.tensor([[2.0, 0.0, 0.0, 0.0]] * 3)  # raw confidence 0.71 at each of three positions
    prop = Proposal(
        torch.arange(3), torch.zeros(3, dtype=torch.long), torch.full((3,), 0.71), torch.zeros(3), drafted(logits)
    )
    assert decided(Credit(0.8, 0.7, 0.5, 1.0)(credit_request(4), Region(0, 4), prop, None)) == [0, 1, 2]  # fused: 0.82
    assert len(Credit(0.85, 0.7, 0.5, 1.0)(credit_request(4), Region(0, 4), prop, None).positions) == 1


def test_credit_decays_by_beta():
    """beta 0.5: the pair of steady tokens needs three rounds to clear 0.85 (dividing by beta would take two)."""
    gate, ref, region = Credit(0.85, 0.5, 0.5, 1.0), CreditReference(4, 0.5, 0.5, 1.0), Region(0, 4)
    req = credit_request(4)
    logits = torch.tensor([[2.0, 0.0, 0.0, 0.0]] * 2)
    counts = []
    for _ in range(3):
        prop = Proposal(
            torch.arange(2), torch.zeros(2, dtype=torch.long), torch.full((2,), 0.71), torch.zeros(2), drafted(logits)
        )
        counts.append(len(gate(req, region, prop, None).positions))
        fused = ref.fused(0, logits[0]).max()
    assert counts == [1, 1, 2] and fused > 0.85


def test_credit_keeps_the_token_with_history_over_a_new_favourite():
    gate, req, region = Credit(0.99, 0.9, 0.5, 2.0), credit_request(5), Region(0, 2)
    steady = torch.tensor([[1.5, 0.0, 0.0, 0.0, 0.0]])
    for _ in range(4):
        gate(
            req,
            region,
            Proposal(torch.tensor([0]), torch.tensor([0]), torch.tensor([0.5]), torch.zeros(1), drafted(steady)),
            None,
        )
    flip = torch.tensor([[1.5, 1.6, 0.0, 0.0, 0.0]])  # token 1 now slightly ahead on raw logits
    decision = gate(
        req,
        region,
        Proposal(torch.tensor([0]), torch.tensor([1]), torch.tensor([0.4]), torch.zeros(1), drafted(flip)),
        None,
    )
    assert decision.ids.tolist() == [0]


def test_credit_accumulates_within_a_block_and_resets_in_the_next():
    gate, req = Credit(0.85, 0.7, 0.5, 1.0), credit_request(4)

    def decide(start: int) -> list[int]:
        logits = torch.tensor([[2.0, 0.0, 0.0, 0.0]] * 2)  # fused 0.82 in a block's first round, 0.857 in its second
        prop = Proposal(
            torch.tensor([start, start + 1]),
            torch.zeros(2, dtype=torch.long),
            torch.full((2,), 0.71),
            torch.zeros(2),
            drafted(logits),
        )
        return decided(gate(req, Region(start, start + 4), prop, None))

    assert decide(0) == [0]  # nothing clears: the fallback
    assert decide(0) == [0, 1]
    assert decide(4) == [4]


def test_credit_samples_from_the_fused_distribution_when_not_greedy():
    """001 B.2 "does not change the underlying sampling ... but simply replaces the original distribution": at
    temperature T the tokens are drawn from softmax((z + alpha log(1 + C)) / T), with the request's RNG."""
    logits = torch.tensor([[1.0, 0.8, 0.6, 0.4, 0.2]] * 4)
    differs = False
    for seed in range(8):
        req = credit_request(5, 8, SamplingParams(temperature=0.7, seed=seed))
        prop = Proposal(torch.arange(4), logits.argmax(-1), torch.full((4,), 0.3), torch.zeros(4), drafted(logits))
        decision = Credit(0.0, 0.7, 0.5, 1.0)(req, Region(0, 8), prop, None)
        fused = torch.stack([CreditReference(5, 0.7, 0.5, 1.0).fused(p, z) for p, z in enumerate(logits)])
        generator = next(draw_generators(seed))  # the request's first draw
        fused_mask = torch.cat([fused, torch.zeros(4, 1)], -1)  # the mask token's probability: none
        sampled = torch.multinomial(torch.softmax(fused_mask.log() / 0.7, -1), 1, generator=generator).squeeze(-1)
        assert decision.ids.tolist() == sampled.tolist()
        differs |= sampled.tolist() != fused.argmax(-1).tolist()
    assert differs  # the test would see an argmax


# ---------------------------------------------------------------- hierarchical (001 B.1)


def bisect_reference(n: int) -> list[int]:
    """Tokens decided per forward when every token sits between the two thresholds: each forward decides the
    centre of every masked span (B.1's recursive split)."""
    counts, todo = [], [n]
    while todo:
        counts.append(len(todo))
        todo = [part for size in todo for part in ((size - 1) // 2, size // 2) if part]
    return counts


@pytest.mark.parametrize("n", [1, 2, 7, 15, 16, 23])
def test_hierarchical_splits_spans_recursively(n):
    gate, req, region = Hierarchical(0.92, 0.62), request(), Region(0, n)
    remaining, counts = list(range(n)), []
    while remaining:
        decision = gate(req, region, proposal(remaining, [0.7] * len(remaining)), None)
        counts.append(len(decision.positions))
        remaining = [p for p in remaining if p not in decided(decision)]
    assert counts == bisect_reference(n)
    assert len(counts) == math.ceil(math.log2(n + 1))


def test_hierarchical_picks_the_centre_over_a_more_confident_edge():
    probs = [0.9, 0.7, 0.7, 0.65, 0.7, 0.7, 0.9]
    assert decided(Hierarchical(0.92, 0.62)(request(), Region(0, 7), proposal(range(7), probs), None)) == [3]


def test_hierarchical_takes_the_candidate_nearest_the_centre_above_the_lower_bound():
    def choose(probs: list[float]) -> list[int]:
        return decided(Hierarchical(0.92, 0.62)(request(), Region(0, 7), proposal(range(7), probs), None))

    assert choose([0.7, 0.7, 0.7, 0.5, 0.63, 0.7, 0.7]) == [2]  # centre below the bound; 2 and 4 equally near
    assert choose([0.7, 0.7, 0.63, 0.5, 0.64, 0.7, 0.7]) == [4]  # of the two, the more confident
    assert choose([0.7, 0.7, 0.62, 0.5, 0.62, 0.7, 0.7]) == [1]  # at the bound is not above it
    assert choose([0.8, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]) == [0]  # the only candidate, however far


def test_hierarchical_one_per_span_plus_everything_above_the_threshold():
    positions = [0, 1, 2, 5, 6, 7, 8, 9, 12]
    probs = [0.7, 0.7, 0.7, 0.95, 0.7, 0.7, 0.7, 0.92, 0.3]
    decision = Hierarchical(0.92, 0.62)(request(), Region(0, 13), proposal(positions, probs), None)
    # span 0-2: centre 1; span 5-9: 5 is above the threshold, centre 7; 9 at 0.92 is not above; 12 below the bound
    assert decided(decision) == [1, 5, 7]


def test_hierarchical_a_span_without_candidates_leaves_the_next_spans_alone():
    decision = Hierarchical(0.92, 0.62)(
        request(), Region(0, 8), proposal([0, 1, 4, 5, 6], [0.3, 0.4] + [0.7] * 3), None
    )
    assert decided(decision) == [5]


def test_hierarchical_falls_back_to_the_most_confident_when_nothing_clears():
    decision = Hierarchical(0.92, 0.62)(request(), Region(0, 4), proposal([0, 1, 3], [0.3, 0.5, 0.4]), None)
    assert decided(decision) == [1]


# ---------------------------------------------------------------- entropy window (WeDLM 002 Eq. 11)


def test_entropy_window_penalises_distance_to_the_leftmost_mask():
    gate = EntropyWindow(0.4, 0.1)
    positions = [4, 5, 6, 7, 9, 10]
    entropy = [0.05, 0.05, 0.05, 0.25, 0.05, 0.05]
    # adjusted: 0.05, 0.15, 0.25, 0.55, 0.55, 0.65 (distances from 4, gaps included)
    decision = gate(request(), Region(4, 12), proposal(positions, [0.9] * 6, entropy=entropy), None)
    assert decided(decision) == [4, 5, 6]
    no_penalty = EntropyWindow(0.4, 0.0)(
        request(), Region(4, 12), proposal(positions, [0.9] * 6, entropy=entropy), None
    )
    assert decided(no_penalty) == [4, 5, 6, 7, 9, 10]


def test_entropy_window_threshold_is_strict():
    prop = proposal([0, 1, 2], [0.9] * 3, entropy=[0.125, 0.25, 0.125])  # exact in binary
    assert decided(EntropyWindow(0.25, 0.0)(request(), Region(0, 4), prop, None)) == [0, 2]


def test_entropy_window_falls_back_to_the_lowest_adjusted_entropy():
    gate = EntropyWindow(0.3, 0.2)
    decision = gate(request(), Region(0, 8), proposal([0, 4], [0.5, 0.9], entropy=[1.0, 0.5]), None)
    assert decided(decision) == [0]  # 1.0 + 0 < 0.5 + 0.8


# ---------------------------------------------------------------- Learn2PD filter gate (004 Alg. 2)


def verdict_with_scores(prop: Proposal, scores) -> Verdict:
    ids = prop.ids
    return Verdict(prop.positions, ids, ids, ids[:, None], prop.probs, prop.probs, torch.tensor(scores))


def test_filter_gate_accepts_scores_above_threshold_not_confidences():
    prop = proposal([0, 1, 2, 3], [0.99, 0.2, 0.99, 0.5])
    decision = FilterGate(0.96)(request(), Region(0, 4), prop, verdict_with_scores(prop, [0.5, 0.97, 0.96, 0.99]))
    assert decided(decision) == [1, 3]


def test_filter_gate_falls_back_to_the_best_score():
    prop = proposal([0, 1, 2], [0.99, 0.2, 0.5])
    decision = FilterGate(0.96)(request(), Region(0, 4), prop, verdict_with_scores(prop, [0.1, 0.3, 0.2]))
    assert decided(decision) == [1]


# ---------------------------------------------------------------- guider agreement (FlashDLM 003 Alg. 1, C.4)


def speculative(*args, **kwargs) -> GuiderAgreement:
    """The gate with follow=guider: speculative decoding of the guider (the drafter's mode: below)."""
    return GuiderAgreement(*args, **kwargs, follow="guider")


def guider_verdict(start, draft, target, topk=None, target_probs=None, filter_scores=None) -> Verdict:
    draft, target = torch.tensor(draft), torch.tensor(target)
    topk = torch.tensor(topk) if topk is not None else target[:, None]
    target_probs = torch.tensor(target_probs) if target_probs is not None else torch.full((len(draft),), 0.9)
    positions = torch.arange(start, start + len(draft))
    scores = torch.tensor(filter_scores) if filter_scores is not None else None
    return Verdict(positions, draft, target, topk, torch.zeros(len(draft)), target_probs, scores)


def drafts(start: int, ids: list[int], probs: list[float] | None = None) -> Proposal:
    return proposal(list(range(start, start + len(ids))), probs or [0.9] * len(ids), ids=ids)


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_guider_agreement_accepts_the_agreeing_prefix_and_one_free_token(k):
    target = [20, 21, 22, 23, 24]
    draft = target[:k] + [30 + i for i in range(k, 5)]
    verdict = guider_verdict(2, draft, target)
    plain = speculative(1, 0.5, bonus_token=False)(request(), Region(0, 8), drafts(2, draft), verdict)
    bonus = speculative(1, 0.5, bonus_token=True)(request(), Region(0, 8), drafts(2, draft), verdict)
    n_plain = k if k else 1  # with no agreement, the guider's own token
    assert decided(plain) == list(range(2, 2 + n_plain)) and plain.ids.tolist() == target[:n_plain]
    n_bonus = min(k + 1, 5)
    assert decided(bonus) == list(range(2, 2 + n_bonus)) and bonus.ids.tolist() == target[:n_bonus]


def test_guider_agreement_top2_needs_the_guidance_threshold():
    target, draft = [20, 21, 22, 23], [20, 31, 32, 23]
    topk = [[20, 40], [21, 31], [22, 32], [23, 41]]
    target_probs = [0.9, 0.6, 0.6, 0.9]
    verdict = guider_verdict(0, draft, target, topk, target_probs)
    # drafter probabilities: 31 clears 0.5 * 0.6 (0.35 > 0.3); 32 does not (0.25); the rest agree anyway
    prop = drafts(0, draft, [0.9, 0.35, 0.25, 0.9])
    assert decided(speculative(2, 0.5, False)(request(), Region(0, 4), prop, verdict)) == [0, 1]
    assert decided(speculative(1, 0.5, False)(request(), Region(0, 4), prop, verdict)) == [0]
    assert decided(speculative(2, 0.3, False)(request(), Region(0, 4), prop, verdict)) == [0, 1, 2, 3]
    not_in_top2 = guider_verdict(0, draft, target, [[20, 40], [21, 41], [22, 32], [23, 41]], target_probs)
    assert decided(speculative(2, 0.3, False)(request(), Region(0, 4), prop, not_in_top2)) == [0]


def test_guider_agreement_counts_known_positions_as_certain():
    """Verdict positions not in the proposal (decided or filled drafts) have drafter probability 1."""
    target, draft = [20, 21, 22], [20, 31, 22]
    verdict = guider_verdict(4, draft, target, [[20, 40], [21, 31], [22, 40]], [0.9, 0.95, 0.9])
    prop = proposal([4, 6], [0.9, 0.9], ids=[20, 22])  # position 5 is a filled draft, not proposed
    assert decided(speculative(2, 0.9, False)(request(), Region(4, 7), prop, verdict)) == [4, 5, 6]


def test_guider_agreement_keeps_confident_drafts_past_the_agreement_as_context():
    target, draft = [20, 21, 22, 23, 24], [20, 31, 22, 23, 24]
    verdict = guider_verdict(0, draft, target, filter_scores=[0.99, 0.99, 0.99, 0.5, 0.97])
    gate = speculative(1, 0.5, bonus_token=True, keep_threshold=0.96)
    decision = gate(request(), Region(0, 5), drafts(0, draft), verdict)
    assert decided(decision) == [0, 1] and decision.ids.tolist() == [20, 21]
    assert decision.fill_positions.tolist() == [2, 4] and decision.fill_ids.tolist() == [22, 24]
    without = speculative(1, 0.5, True, 0.96)(
        request(), Region(0, 5), drafts(0, draft), guider_verdict(0, draft, target)
    )
    assert without.fill_positions.tolist() == []


def test_guider_agreement_top2_never_rejects_the_guiders_own_choice():
    verdict = guider_verdict(0, [20, 21], [20, 21], [[20, 40], [21, 41]], [0.9, 0.9])
    prop = drafts(0, [20, 21], [0.1, 0.1])  # the drafter is unsure, but the guider agrees
    assert decided(speculative(2, 0.5, False)(request(), Region(0, 2), prop, verdict)) == [0, 1]


def test_guider_agreement_guidance_threshold_is_strict():
    verdict = guider_verdict(0, [31, 21], [20, 21], [[20, 31], [21, 41]], [0.5, 0.9])
    prop = drafts(0, [31, 21], [0.25, 0.9])  # 0.25 is exactly 0.5 * 0.5
    decision = speculative(2, 0.5, False)(request(), Region(0, 2), prop, verdict)
    assert decided(decision) == [0] and decision.ids.tolist() == [20]


def test_guider_agreement_full_agreement_with_bonus_and_filter_scores():
    verdict = guider_verdict(0, [20, 21, 22], [20, 21, 22], filter_scores=[0.99, 0.99, 0.99])
    decision = speculative(1, 0.5, True, 0.96)(request(), Region(0, 3), drafts(0, [20, 21, 22]), verdict)
    assert decided(decision) == [0, 1, 2] and decision.fill_positions.tolist() == []


def test_guider_agreement_keep_threshold_is_strict():
    verdict = guider_verdict(0, [20, 31, 32], [20, 21, 22], filter_scores=[0.9, 0.5, 0.75])
    decision = speculative(1, 0.5, False, 0.5)(request(), Region(0, 3), drafts(0, [20, 31, 32]), verdict)
    assert decision.fill_positions.tolist() == [2]


# ---------------------------------------------------------------- follow=drafter (003 Alg. 1 as written)


def algorithm1(draft: list[int], target: list[int]) -> int:
    """003 Alg. 1: the length of the matching run unmasked with tok_DLM, or 1 (i_1 with tok_DLM[i_1])."""
    k = 0
    while k < len(draft) and draft[k] == target[k]:
        k += 1
    return max(k, 1)


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_follow_drafter_unmasks_the_matching_run_or_the_first_draft_with_the_drafters_tokens(k):
    target = [20, 21, 22, 23, 24]
    draft = target[:k] + [30 + i for i in range(k, 5)]
    prop = drafts(2, draft)
    prop.logprobs = TokenLogprobs(torch.full((5,), -0.5), torch.tensor(draft)[:, None], torch.zeros(5, 1), False)
    verdict = guider_verdict(2, draft, target)
    verdict.logprobs = TokenLogprobs(torch.full((5,), -2.0), torch.tensor(target)[:, None], torch.zeros(5, 1), True)
    decision = GuiderAgreement(1, 0.5, bonus_token=True)(request(), Region(0, 8), prop, verdict)
    n = algorithm1(draft, target)
    assert decided(decision) == list(range(2, 2 + n)) and decision.ids.tolist() == draft[:n]
    assert decision.logprobs.chosen.tolist() == [-0.5] * n and not decision.logprobs.verified  # the drafter's


def test_follow_drafter_top2_accepts_the_drafters_token_the_guider_ranks_second():
    verdict = guider_verdict(0, [20, 31, 22], [20, 21, 22], [[20, 40], [21, 31], [22, 40]], [0.9, 0.6, 0.9])
    decision = GuiderAgreement(2, 0.5, False)(
        request(), Region(0, 3), drafts(0, [20, 31, 22], [0.9, 0.35, 0.9]), verdict
    )
    assert decided(decision) == [0, 1, 2] and decision.ids.tolist() == [20, 31, 22]


def test_follow_drafter_with_the_filter_runs_through_kept_drafts_and_decides_none_past_the_run():
    """The run goes on through drafts the filter keeps (the filter and the guider decide how many drafter tokens are
    accepted); a kept draft past the run is not decided: past a draft neither vouches for, the guider's verdicts read
    a rejected token."""
    gate = GuiderAgreement(1, 0.5, True, keep_threshold=0.96)
    target = [20, 21, 22, 23, 24, 25]
    draft = [20, 31, 22, 33, 34, 35]
    verdict = guider_verdict(0, draft, target, filter_scores=[0.5, 0.99, 0.5, 0.5, 0.97, 0.5])
    decision = gate(request(), Region(0, 6), drafts(0, draft), verdict)
    # run: 0 agrees, 1 kept, 2 agrees, 3 neither; 4 kept past the run
    assert decided(decision) == [0, 1, 2] and decision.ids.tolist() == [20, 31, 22]
    assert decision.fill_positions.tolist() == []


def test_follow_drafter_filter_keeps_only_scores_above_its_threshold():
    """004 Alg. 2 unmasks where the filter's score is > tau: a score equal to it does not lengthen the run."""
    draft, target = [20, 31, 32], [20, 21, 22]
    verdict = guider_verdict(0, draft, target, filter_scores=[0.9, 0.75, 0.5])
    decision = GuiderAgreement(1, 0.5, True, keep_threshold=0.5)(request(), Region(0, 3), drafts(0, draft), verdict)
    assert decided(decision) == [0, 1] and decision.ids.tolist() == [20, 31]
