"""Speculative decoding in the serving loop: a draft model proposes K tokens, one verify step of the target checks them.

One round for a decoding request whose last delivered token ``t0`` is not yet in either KV cache (both caches hold
the same L tokens):

1. the draft decodes K steps (``draft.decode_step``, batched over the requests): ``t0`` in, d_1 out, d_1 in, ...,
   d_K out; its cache then holds L + K tokens (``t0, d_1 .. d_{K-1}``);
2. the target verifies in one step: ``target.prefill([t0, d_1 .. d_K], all_logits=True)``, the chunked prefill
   over the cached prefix, whose K + 1 positions' logits are the target's predictions after ``t0``, after d_1, ...;
3. verification (``verify_greedy`` / ``verify_sampled``) accepts n of the K drafts and picks one more token from the
   target (the correction, or the bonus token when all K were accepted): n + 1 tokens are delivered;
4. roll back: both caches are cut to L + 1 + n tokens (``t0, d_1 .. d_n``; the new last token is the picked one,
   not yet cached, as after a plain decode step). A draft that had all K accepted lacks d_K (and one given no
   drafts lacks ``t0``): every such draft catches up in one batched decode step, its logits unused (an engine
   folds this into the next round's first draft step; here it is one more draft step, counted in the round's
   time).

Greedy verification accepts d_i while the target's argmax at position i - 1 equals it; the picked token is the
target's argmax at position n, so the output equals the target's own greedy decode token for token. Sampled
verification is the standard rejection sampling (Leviathan et al. 2023; Chen et al. 2023): d_i ~ q_i (the draft's
distribution) is accepted with probability min(1, p_i(d_i) / q_i(d_i)), and on the first rejection the token is
drawn from norm(max(0, p_i - q_i)); with all K accepted the bonus token is drawn from p_K. Each emitted token is
then distributed exactly as the target's p. The random stream is one seeded ``torch.Generator`` (``Sampler``).

Each round is recorded (``Round``: the request, tokens drafted, tokens accepted, the accept/reject decisions in
order) in the serving step's ``rounds``; ``spec_summary`` turns them into the acceptance rate (accepted / drafted),
tokens per verify step (mean of accepted + 1) and the per-position acceptance (vLLM's
``num_accepted_tokens_per_pos / num_drafts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from roofline.errors import RooflineError

__all__ = ["Round", "Sampler", "SpecSettings", "Verdict", "accept_probability", "check_draft", "residual",
           "speculate", "spec_summary", "verify_greedy", "verify_sampled"]


@dataclass(frozen=True)
class SpecSettings:
    """K draft tokens per verify step; ``sampled``: rejection sampling at ``temperature`` (else greedy)."""

    k: int
    sampled: bool = False
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= 64:
            raise RooflineError(f"--spec (draft tokens per verify step) must be a whole number from 1 to 64, not "
                                f"{self.k!r}: e.g. --spec 3.")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise RooflineError(f"the sampling temperature must be a positive number, not {self.temperature!r}: "
                                "e.g. --temperature 1.")

    @property
    def label(self) -> str:
        return f"spec={self.k},{'sampled' if self.sampled else 'greedy'}"


class Sampler:
    """Picks tokens from logits: greedy (argmax), or sampled from softmax(logits / T) with one seeded generator."""

    def __init__(self, sampled: bool = False, temperature: float = 1.0, seed: int = 0):
        import torch

        self.sampled, self.temperature = sampled, float(temperature)
        self.gen = torch.Generator().manual_seed(int(seed))

    def probs(self, logits):
        """softmax(logits / T) in fp32 on the host, over the last dim."""
        import torch

        return torch.softmax(logits.detach().float().cpu() / self.temperature, dim=-1)

    def draw(self, probs) -> int:
        """One token from ``probs`` [vocab]."""
        import torch

        return int(torch.multinomial(probs, 1, generator=self.gen))

    def uniform(self) -> float:
        import torch

        return float(torch.rand((), generator=self.gen))

    def pick(self, logits) -> list:
        """One token per row of ``logits`` ([vocab] or [B, vocab]): argmax, or a draw from its distribution."""
        rows = logits.reshape(-1, logits.shape[-1])
        if not self.sampled:
            return [int(t) for t in rows.argmax(dim=-1).tolist()]
        p = self.probs(rows)
        return [self.draw(p[i]) for i in range(p.shape[0])]


@dataclass(frozen=True)
class Verdict:
    """``accepted`` leading drafts kept, then ``token`` (the target's correction or bonus); ``decisions``: one
    bool per draft examined, in order (True = accepted; at most one False, the last)."""

    accepted: int
    token: int
    decisions: tuple


def verify_greedy(drafts, target_logits) -> Verdict:
    """Accept d_i while argmax(target_logits[i - 1]) == d_i; then the target's argmax at the first mismatch (or the
    bonus position K). ``target_logits``: [K + 1, vocab]."""
    best = [int(t) for t in target_logits.argmax(dim=-1).tolist()]
    decisions = []
    for i, d in enumerate(drafts):
        ok = best[i] == int(d)
        decisions.append(ok)
        if not ok:
            break
    n = sum(decisions)
    return Verdict(n, best[n], tuple(decisions))


def accept_probability(p, q, token: int) -> float:
    """min(1, p(token) / q(token)): the chance rejection sampling keeps a draft token drawn from q."""
    qt = float(q[token])
    return 1.0 if qt <= 0 else min(1.0, float(p[token]) / qt)


def residual(p, q):
    """norm(max(0, p - q)): where a rejected draft's replacement is drawn from (p itself where p <= q everywhere,
    which happens only when p == q and then no draft is rejected)."""
    r = (p - q).clamp(min=0)
    s = float(r.sum())
    return p if s <= 0 else r / s


def verify_sampled(drafts, q, p, sampler: Sampler) -> Verdict:
    """Rejection sampling: ``q`` [K, vocab] the draft's distributions the drafts were drawn from, ``p`` [K + 1, vocab]
    the target's; accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); on the first rejection draw from
    ``residual(p_i, q_i)``; with every draft accepted draw the bonus token from p_K."""
    decisions = []
    for i, d in enumerate(drafts):
        ok = sampler.uniform() < accept_probability(p[i], q[i], int(d))
        decisions.append(ok)
        if not ok:
            return Verdict(i, sampler.draw(residual(p[i], q[i])), tuple(decisions))
    return Verdict(len(drafts), sampler.draw(p[len(drafts)]), tuple(decisions))


@dataclass(frozen=True)
class Round:
    """One verify step of one request: ``drafted`` tokens proposed, ``accepted`` kept, the decisions in order."""

    id: int
    drafted: int
    accepted: int
    decisions: tuple

    def to_list(self) -> list:
        return [self.id, self.drafted, self.accepted, "".join("A" if d else "R" for d in self.decisions)]


def check_draft(target, draft) -> None:
    """A draft must share the target's vocabulary and hold as many KV slots as long as the target's."""
    if draft.cfg.vocab != target.cfg.vocab:
        raise RooflineError(f"the draft {draft.cfg.name} has a vocabulary of {draft.cfg.vocab} tokens, the target "
                            f"{target.cfg.name} {target.cfg.vocab}: a draft proposes the target's token ids, so give "
                            "a draft with the same vocabulary.")
    if len(draft.lengths) < len(target.lengths) or draft.max_len < target.max_len:
        raise RooflineError(f"the draft holds {len(draft.lengths)} KV slots of {draft.max_len} tokens, the target "
                            f"{len(target.lengths)} of {target.max_len}: build the draft with at least as many, as "
                            "long.")


def speculate(target, draft, sampler: Sampler, work) -> list:
    """One round for each of ``work`` = [(request id, slot, last token, K for it)]: draft, verify, roll back.

    Returns, per entry, (tokens to deliver, ``Round``); K = 0 is a plain decode step through the verify path.
    """
    import torch

    drafts = {rid: [] for rid, *_ in work}
    qs = {rid: [] for rid, *_ in work}
    base = {rid: int(target.lengths[slot]) for rid, slot, _, _ in work}
    for i in range(max((k for *_, k in work), default=0)):          # the draft's steps, batched
        step = [(rid, slot, (drafts[rid][-1] if drafts[rid] else last)) for rid, slot, last, k in work if k > i]
        logits = draft.decode_step(torch.tensor([t for *_, t in step], dtype=torch.long),
                                   torch.tensor([s for _, s, _ in step], dtype=torch.long))
        if sampler.sampled:
            q = sampler.probs(logits)
            for j, (rid, _, _) in enumerate(step):
                qs[rid].append(q[j])
                drafts[rid].append(sampler.draw(q[j]))
        else:
            for (rid, _, _), t in zip(step, logits.argmax(dim=-1).tolist()):
                drafts[rid].append(int(t))
    out, behind = [], []                                             # (slot, token) the draft has not cached
    for rid, slot, last, k in work:
        d = drafts[rid]
        logits = target.prefill(torch.tensor([last] + d, dtype=torch.long), slot, all_logits=True)
        if sampler.sampled:
            v = verify_sampled(d, torch.stack(qs[rid]) if d else None, sampler.probs(logits), sampler)
        else:
            v = verify_greedy(d, logits)
        keep = base[rid] + 1 + v.accepted                            # t0 and the accepted drafts
        target.copy_prefix(slot, slot, keep)                         # in place: cut the rejected positions
        if k and v.accepted < k:
            draft.copy_prefix(slot, slot, keep)
        else:                                                        # d_K never ran through the draft (or t0)
            behind.append((slot, d[-1] if k else last))
        out.append((d[:v.accepted] + [v.token], Round(rid, k, v.accepted, v.decisions)))
    if behind:
        draft.decode_step(torch.tensor([t for _, t in behind], dtype=torch.long),
                          torch.tensor([s for s, _ in behind], dtype=torch.long))
    return out


def spec_summary(rounds) -> dict:
    """Acceptance over ``rounds`` (``Round``s or their ``to_list`` form): rounds, drafted, accepted, the acceptance
    rate (accepted / drafted), tokens per verify step (mean accepted + 1), accepted decisions counted from the
    decisions themselves, and the per-position acceptance (rounds that accepted position j / rounds drafting it)."""
    rs = [r if isinstance(r, Round) else Round(int(r[0]), int(r[1]), int(r[2]), tuple(c == "A" for c in r[3]))
          for r in rounds]
    drafted = sum(r.drafted for r in rs)
    accepted = sum(r.accepted for r in rs)
    k = max((r.drafted for r in rs), default=0)
    per_pos = []
    for j in range(k):
        have = [r for r in rs if r.drafted > j]
        per_pos.append(sum(r.accepted > j for r in have) / len(have) if have else math.nan)
    return {"rounds": len(rs), "drafted": drafted, "accepted": accepted,
            "decisions_accepted": sum(sum(r.decisions) for r in rs),
            "decisions_rejected": sum(len(r.decisions) - sum(r.decisions) for r in rs),
            "acceptance": accepted / drafted if drafted else math.nan,
            "tokens_per_step": (accepted + len(rs)) / len(rs) if rs else math.nan,
            "per_position": per_pos}
