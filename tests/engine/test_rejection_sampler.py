"""The rejection sampler keeps the target's distribution, and a chi-square test has the power to
see a wrong acceptance rule."""

import functools

import torch

from course_lib.engine.rejection_sampler import rejection_sample
from course_lib.engine.sampler import probabilities
from course_lib.engine.sampling_params import SamplingParams

VOCAB, SAMPLES = 5, 20_000
CRITICAL = 18.47  # chi-square, 4 degrees of freedom, p = 0.001


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@functools.lru_cache(maxsize=None)
def first_tokens(rule, params: SamplingParams, seed: int = 0, same_draft: bool = False, samples: int = SAMPLES):
    """Counts of the first emitted token (and of the bonus token) over ``samples`` draws, and the
    target's processed p. Cached: tests share the right rule's run."""
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(2, VOCAB, generator=gen, dtype=torch.float64) * 1.5
    draft_logits = target_logits[:1] if same_draft else torch.randn(1, VOCAB, generator=gen, dtype=torch.float64) * 1.5
    q = probabilities(draft_logits, params).double()
    q = q / q.sum(-1, keepdim=True)
    p = probabilities(target_logits, params).double()
    p = p / p.sum(-1, keepdim=True)
    counts, bonus = torch.zeros(VOCAB, dtype=torch.float64), torch.zeros(VOCAB, dtype=torch.float64)
    for _ in range(samples):
        x = int(torch.multinomial(q[0], 1, generator=gen))
        tokens, accepted = rule(target_logits, [x], q, params, gen)
        counts[tokens[0]] += 1
        if accepted == 1:
            bonus[tokens[1]] += 1
    return counts, bonus, p


def always_accept(target_logits, drafts, q, params, gen):
    return drafts + [int(torch.multinomial(probabilities(target_logits[-1], params), 1, generator=gen))], len(drafts)


def resample_from_p_on_rejection(target_logits, drafts, q, params, gen):
    """min(1, p/q) acceptance, but a rejected draft is replaced by a sample of p, not of max(0, p - q)."""
    p = probabilities(target_logits, params).double()
    p = p / p.sum(-1, keepdim=True)
    x = drafts[0]
    if float(torch.rand(1, generator=gen, dtype=torch.float64)) < min(1.0, float(p[0, x] / q[0, x])):
        return [x, int(torch.multinomial(p[1], 1, generator=gen))], 1
    return [int(torch.multinomial(p[0], 1, generator=gen))], 0


def test_the_first_emitted_token_follows_the_target_distribution():
    stats = {}
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4, top_p=0.95)):
        counts, _, p = first_tokens(rejection_sample, params)
        nonzero = p[0] > 0  # top-k/top-p may remove tokens: they must never be emitted
        assert counts[~nonzero].sum() == 0
        stats[params.top_k] = chi_square(counts[nonzero], p[0][nonzero])
        assert stats[params.top_k] < CRITICAL, stats
    print("right rule chi-square:", stats)


def test_the_bonus_token_follows_the_target_distribution():
    counts, bonus, p = first_tokens(rejection_sample, SamplingParams(temperature=1.0), seed=1, same_draft=True,
                                 samples=10_000)
    assert bonus.sum() == 10_000  # q == p: every draft is accepted
    assert chi_square(bonus, p[1]) < CRITICAL


def test_wrong_acceptance_rules_fail_the_same_test():
    params = SamplingParams(temperature=1.0)
    right, _, p = first_tokens(rejection_sample, params)
    wrong = {rule.__name__: chi_square(first_tokens(rule, params)[0], p[0])
             for rule in (always_accept, resample_from_p_on_rejection)}
    print("right rule chi-square:", chi_square(right, p[0]), "wrong rules:", wrong)
    assert all(value > 10 * CRITICAL for value in wrong.values()), wrong


def test_a_point_mass_proposer_keeps_the_distribution():
    """q(x) = 1 (the n-gram case): accept with p(x), else sample p without x."""
    gen = torch.Generator().manual_seed(5)
    params = SamplingParams(temperature=1.0)
    logits = torch.randn(2, VOCAB, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits[0], -1)
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    for _ in range(10_000):
        counts[rejection_sample(logits, [2], None, params, gen)[0][0]] += 1
    assert chi_square(counts, p) < CRITICAL


def test_greedy_keeps_the_longest_matching_prefix_plus_one_target_token():
    logits = torch.full((4, VOCAB), -1.0, dtype=torch.float64)
    for row, best in enumerate([3, 1, 4, 0]):
        logits[row, best] = 1.0
    greedy = SamplingParams(temperature=0)
    assert rejection_sample(logits, [3, 1, 2], None, greedy) == ([3, 1, 4], 2)  # third draft wrong: target's 4
    assert rejection_sample(logits, [3, 1, 4], None, greedy) == ([3, 1, 4, 0], 3)  # all right: bonus 0
    assert rejection_sample(logits, [0, 1, 4], None, greedy) == ([3], 0)
    assert rejection_sample(logits[:1], [], None, greedy) == ([3], 0)
