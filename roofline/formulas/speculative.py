"""Speculative decoding: the tokens a verify step yields, and the rejection sampler's cost.

A draft proposes ``k`` tokens per sequence; one verify step of the target runs the k + 1 positions (the last
accepted token and the k drafts) and keeps the longest accepted prefix of the drafts plus one token of its own
(the correction at the first rejection, or the bonus token after k acceptances), so a verify step yields between
1 and k + 1 tokens. The workload side (the verify step's ops, the draft's steps) is ``roofline.speculative``.

The expected yield takes exact inputs exactly: a ``fractions.Fraction`` acceptance (or integer counts) gives a
``Fraction``, a float gives a float.
"""

from __future__ import annotations

import operator
from fractions import Fraction

from ..cost import Cost
from ..dtypes import bytes_per_element as _b


def _drafts(k) -> int:
    try:
        n = operator.index(k)
    except TypeError:
        n = 0
    if isinstance(k, bool) or n < 1:
        raise ValueError(f"k (draft tokens per verify step) must be a whole number of at least 1, got {k!r}.")
    return n


def _share(a, what: str):
    if isinstance(a, bool) or not isinstance(a, (int, float, Fraction)) or not 0 <= a <= 1:
        raise ValueError(f"{what} must be a number from 0 to 1, got {a!r}.")
    return a


def expected_tokens(acceptance, k):
    """Tokens per verify step when each of the ``k`` drafts is accepted with probability ``acceptance`` = a,
    independently of the others (the standard model of Leviathan et al. 2023): draft i is kept only if drafts
    1..i are all accepted (probability a^i), and the step always adds one token of its own, so

        E = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a),   and k + 1 at a = 1.

    a = 0.8, k = 3: 1 + 0.8 + 0.64 + 0.512 = 2.952 (exact with ``Fraction(4, 5)``: 369/125)."""
    n, a = _drafts(k), _share(acceptance, "acceptance")
    if a == 1:
        return n + 1
    return (1 - a ** (n + 1)) / (1 - a)


def expected_tokens_from_rates(rates):
    """Tokens per verify step from per-position acceptance rates: ``rates[i]`` = the probability that draft i+1
    is accepted given drafts 1..i were (k = len(rates)). E = 1 + sum over i of rates[0] x ... x rates[i];
    ``expected_tokens(a, k)`` is this with k rates of a."""
    rs = [_share(r, f"acceptance rate {i + 1}") for i, r in enumerate(rates)]
    _drafts(len(rs))
    total, p = 1, 1
    for r in rs:
        p = p * r
        total = total + p
    return total


def expected_tokens_from_positions(accepted_per_position, verify_steps):
    """Tokens per verify step from a measured per-position histogram: ``accepted_per_position[i]`` = how many of
    ``verify_steps`` steps accepted draft i+1 (and so every draft before it), the count vLLM's
    ``spec_decode_num_accepted_tokens_per_pos`` keeps. E = 1 + sum(accepted_per_position) / verify_steps: the
    accepted drafts per step plus the step's own token. The counts cannot grow with the position (draft i+1 is
    only kept after draft i) and none exceeds ``verify_steps``; integers give an exact ``Fraction``."""
    steps = _drafts(verify_steps)
    counts = list(accepted_per_position)
    _drafts(len(counts))
    for i, c in enumerate(counts):
        if isinstance(c, bool) or not isinstance(c, (int, float, Fraction)) or not 0 <= c <= steps:
            raise ValueError(f"accepted count at position {i + 1} must be from 0 to the {steps} verify steps, "
                             f"got {c!r}.")
        if i and c > counts[i - 1]:
            raise ValueError(f"accepted count at position {i + 1} ({c}) exceeds position {i}'s ({counts[i - 1]}): a "
                             "draft is only kept after every draft before it.")
    return 1 + Fraction(sum(counts), steps) if all(isinstance(c, int) for c in counts) else \
        1 + sum(counts) / steps


def rejection_sampling(batch: int, k: int, vocab: int, *, prob_dtype: str = "fp32") -> Cost:
    """Verifying ``k`` drafts of ``batch`` sequences by rejection sampling, as one fused pass over the vocabulary.

    Assumed (vLLM's rejection sampler, fp32 probabilities): the target's logits at the k + 1 positions and the
    draft's at the k positions are read once (``prob_dtype``), and each is turned into probabilities (softmax: 4
    FLOPs per element, as ``softmax`` counts); at each draft position the residual max(0, p - q) is normalised
    (subtract, clamp, sum, divide: 4 per element). So FLOPs = 4 x V x B x ((k + 1) + k + k) and bytes = V x B x
    (2k + 1) x bytes(prob_dtype). The acceptance tests (k per sequence), the uniform draws and the sampled token
    ids are O(k x B): NB not counted. Greedy verification (an argmax compare) costs at most this. The same cost is
    charged for every draft (an n-gram draft's one-hot q read as dense is an upper bound)."""
    n = _drafts(k)
    elements = batch * vocab
    return Cost(4 * elements * (3 * n + 1), elements * (2 * n + 1) * _b(prob_dtype))
