"""MoE routing: which k of E experts each token goes to, and with what weight, exactly as transformers does it.

    weights, ids = route(logits, k, kind="softmax_topk")      # logits [T, E] -> [T, k] fp32, [T, k] int64

Four kinds (``roofline.formulas.MOE_ROUTING``), each the same torch calls in the same order as the
model's router in transformers (so ties break the same way: ``torch.topk`` on the same values):

* "softmax_topk" (Mixtral, Qwen2-MoE, Qwen3-MoE, ERNIE-4.5): probs = softmax(fp32 logits) over E, top-k of the
  probs (of probs + ``bias``, ERNIE's e_score_correction_bias, which chooses but does not weigh: the weights are
  the chosen probs), renormalised to sum 1 when ``renorm`` (Qwen's norm_topk_prob; Mixtral, ERNIE always).
  NB: Qwen then casts the weights to the logits' dtype; ours stay fp32 (cast them if a parity test needs it).
* "topk_softmax" (GPT-OSS): top-k of the logits themselves (in their own dtype, as GPT-OSS does), then a
  softmax over the k chosen.
* "sigmoid_group" (DeepSeek-V3): scores = sigmoid(fp32 logits); the choice uses scores + ``bias``
  (e_score_correction_bias) only: with ``n_group`` > 1 the experts form n_group groups, each scored by the sum
  of its two best biased scores, the ``topk_group`` best groups are kept, and the top-k is taken within them
  (``sorted=False``, as transformers). weights = the UN-biased scores of the chosen, divided by their sum
  (+ 1e-20) when ``renorm``, times ``scale`` (routed_scaling_factor).
* "sigmoid_topk" (Llama-4): top-k of the logits (in their own dtype), weights = sigmoid(fp32 chosen logits),
  not renormalised (the model applies them to the experts' inputs: ``ModelConfig.routed_input``).

The router's gate GEMM (x @ W[H, E]) is an ordinary ``ops.linear``; this is the step after it. Torch only: a
[T, E] selection is tiny next to the expert GEMMs (``cost``: ``roofline.formulas.routing``).
"""

from __future__ import annotations

import torch

from roofline import formulas as F
from roofline.errors import RooflineError

KINDS = F.MOE_ROUTING


def _check(logits, k, kind, n_group, topk_group, bias) -> tuple[int, int]:
    if kind not in KINDS:
        raise RooflineError(f"unknown routing kind {kind!r}: choose one of {', '.join(KINDS)}.")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.dtype.is_floating_point:
        got = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise RooflineError(f"router logits must be a float tensor [tokens, experts], got {got}: reshape the gate "
                            "GEMM's output to 2-D.")
    T, E = logits.shape
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= E:
        raise RooflineError(f"k (experts per token) must be a whole number from 1 to the {E} experts, got {k!r}.")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (E,)):
        raise RooflineError(f"the score correction bias must be a tensor [{E}] (one per expert), got "
                            f"{list(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}.")
    if kind == "topk_softmax" and bias is not None:
        raise RooflineError("topk_softmax routing takes no score correction bias: give it to softmax_topk or "
                            "sigmoid_group.")
    if kind == "sigmoid_group":
        if n_group < 1 or E % n_group:
            raise RooflineError(f"n_group must divide the {E} experts, got {n_group}: use the model's n_group.")
        if n_group > 1 and E // n_group < 2:
            raise RooflineError(f"group-limited routing scores a group by its top 2, so a group needs 2 or more "
                                f"experts; {E} experts in {n_group} groups have {E // n_group}: use fewer groups.")
        if not 1 <= topk_group <= n_group or k > topk_group * (E // n_group):
            raise RooflineError(f"topk_group must be 1..{n_group} groups holding at least k = {k} experts, got "
                                f"{topk_group}: use the model's topk_group.")
    return T, E


def route(logits: torch.Tensor, k: int, *, kind: str, renorm: bool = True, n_group: int = 1, topk_group: int = 1,
          bias: torch.Tensor | None = None, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32, ids [T, k] int64) of the k experts each token goes to (module docstring)."""
    # logits: [T, E] any float dtype
    T, E = _check(logits, k, kind, n_group, topk_group, bias)
    if kind == "softmax_topk":
        probs = torch.softmax(logits.float(), dim=-1)
        if bias is None:
            w, ids = torch.topk(probs, k, dim=-1)
        else:                                     # ERNIE: chosen by probs + bias, weighed by the probs
            ids = torch.topk(probs + bias.float(), k, dim=-1)[1]
            w = probs.gather(1, ids)
        if renorm:
            w = w / w.sum(dim=-1, keepdim=True)
        return w, ids
    if kind == "topk_softmax":
        top, ids = torch.topk(logits, k, dim=-1)
        return torch.softmax(top.float(), dim=-1), ids
    if kind == "sigmoid_topk":
        top, ids = torch.topk(logits, k, dim=-1)
        return top.float().sigmoid(), ids
    scores = logits.float().sigmoid()
    choice = scores if bias is None else scores + bias.float()
    if n_group > 1:
        per = E // n_group
        group_scores = choice.view(T, n_group, per).topk(2, dim=-1)[0].sum(dim=-1)        # [T, n_group]
        group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        keep = group_mask.unsqueeze(-1).expand(T, n_group, per).reshape(T, E)
        choice = choice.masked_fill(~keep.bool(), float("-inf"))
    ids = torch.topk(choice, k=k, dim=-1, sorted=False)[1]
    w = scores.gather(1, ids)
    if renorm:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * scale, ids


def reference(logits: torch.Tensor, k: int, *, kind: str, renorm: bool = True, n_group: int = 1,
              topk_group: int = 1, bias: torch.Tensor | None = None, scale: float = 1.0):
    """A plain per-token reimplementation in fp64 (Python sorts, no torch.topk), for ``roofline check``:
    (weights [T, k] fp64, ids [T, k] int64) with each row's ids in descending order of the choice score and
    ties to the lower expert id. Compare as sets per token (``same_routing``): torch's unsorted top-k may order
    them otherwise, and it breaks exact ties its own way (the checks use tie-free logits)."""
    T, E = _check(logits, k, kind, n_group, topk_group, bias)
    lg = logits.double().tolist()
    bz = [0.0] * E if bias is None else bias.double().tolist()
    ws, ids = [], []
    for row in lg:
        if kind == "softmax_topk":
            m = max(row)
            ex = [torch.tensor(v - m, dtype=torch.float64).exp().item() for v in row]
            p = [v / sum(ex) for v in ex]
            top = sorted(range(E), key=lambda e: (-(p[e] + bz[e]), e))[:k]
            w = [p[e] for e in top]
            w = [v / sum(w) for v in w] if renorm else w
        elif kind == "topk_softmax":
            top = sorted(range(E), key=lambda e: (-row[e], e))[:k]
            m = max(row[e] for e in top)
            ex = [torch.tensor(row[e] - m, dtype=torch.float64).exp().item() for e in top]
            w = [v / sum(ex) for v in ex]
        elif kind == "sigmoid_topk":
            top = sorted(range(E), key=lambda e: (-row[e], e))[:k]
            w = [1.0 / (1.0 + torch.tensor(-row[e], dtype=torch.float64).exp().item()) for e in top]
        else:
            s = [1.0 / (1.0 + torch.tensor(-v, dtype=torch.float64).exp().item()) for v in row]
            c = [s[e] + bz[e] for e in range(E)]
            per = E // n_group
            gs = [sum(sorted(c[g * per:(g + 1) * per], reverse=True)[:2]) for g in range(n_group)]
            groups = set(sorted(range(n_group), key=lambda g: (-gs[g], g))[:topk_group])
            top = sorted((e for e in range(E) if e // per in groups), key=lambda e: (-c[e], e))[:k]
            w = [s[e] for e in top]
            w = [v / (sum(w) + 1e-20) for v in w] if renorm else w
            w = [v * scale for v in w]
        ws.append(w)
        ids.append(top)
    return torch.tensor(ws, dtype=torch.float64), torch.tensor(ids, dtype=torch.int64)


def same_routing(w, ids, w_ref, ids_ref) -> float:
    """Max |weight - reference weight| after matching experts per token (sorting each row by expert id); inf
    when a token's expert sets differ."""
    if w.shape != w_ref.shape or ids.shape != ids_ref.shape:
        return float("inf")
    o, o_ref = ids.sort(dim=-1), ids_ref.sort(dim=-1)
    if not torch.equal(o.values.cpu(), o_ref.values.cpu()):
        return float("inf")
    a = w.double().cpu().gather(1, o.indices.cpu())
    b = w_ref.double().cpu().gather(1, o_ref.indices.cpu())
    return float((a - b).abs().max()) if a.numel() else 0.0


def cost(tokens: int, n_experts: int, k: int, *, kind: str = "softmax_topk", renorm: bool = True, n_group: int = 1,
         score_bias: bool = False, logits_dtype: str = "fp32"):
    """The routing step's Cost (roofline.formulas.routing); the gate GEMM is a linear's (formulas.router)."""
    return F.routing(tokens, n_experts, k, kind=kind, renorm=renorm, n_group=n_group, score_bias=score_bias,
                     logits_dtype=logits_dtype)
