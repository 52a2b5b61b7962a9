"""Tensor parallelism, as a cost model: how a layer is split over N ranks and what the ranks exchange.

Megatron-LM's sharding (Shoeybi et al. 2019, as vLLM implements it):

* column-parallel (each rank holds a slice of the output features, no communication):
  q_proj, k_proj, v_proj (whole heads per rank), gate_proj, up_proj (intermediate / N);
* row-parallel (each rank holds a slice of the input features and produces a partial sum of
  the whole [T, H] output): o_proj, down_proj; an **all-reduce** of [T, H] after each, two
  per layer, on the critical path (between the linear and the residual add: no overlap);
* attention, RoPE and the KV cache run on the rank's own heads: Hq / N query heads and
  Hkv / N KV heads; when there are fewer KV heads than ranks each KV head is replicated on
  N / Hkv ranks and a rank holds one (vLLM's QKVParallelLinear), so N must then be a multiple
  of Hkv;
* vocab-parallel embedding (each rank holds V / N rows, gathers the rows it owns, zeros the
  rest; an all-reduce of [T, H] sums them) and lm_head (each rank computes V / N logits;
  an **all-gather** of [rows, V] assembles them). A vocabulary that N does not divide is
  padded to the next multiple (padding rows are never read, padding logits are dropped);
* norms, residual adds and the final norm are replicated: every rank does the whole [T, H].

``shard(cfg, tp)`` checks the rules (a one-line RooflineError names the valid sizes) and
returns the per-rank sizes; ``step_collectives`` lists each step's collectives with their
message bytes. Costs of the ops are ``roofline.workload``'s, with these per-rank sizes;
a collective's time is ``roofline.interconnect.Interconnect.time`` (latency + wire bytes /
link bandwidth, ring volume 2(N-1)/N per all-reduce: ``formulas.collective_bytes``).

Mixtures of experts (issue 21). Under --tp every rank holds a slice of every expert (moe_intermediate / N
columns of gate and up, rows of down: a grouped GEMM of E experts of width I/N) and the MoE layer ends in the
MLP all-reduce, as a dense one. Under **expert parallelism** (``shard(cfg, tp, ep)`` with ep = tp = N) each
rank holds E/N whole experts (rank r: experts r*E/N ..); N must divide E. The ep ranks are the tp ranks
(one group): attention, norms, the router, dense layers and shared experts are sharded exactly as under
--tp N. DeepSeek/vLLM-style data-parallel attention (attention replicated per rank on its own requests, ep
across the data-parallel ranks) is not modelled. Per MoE layer each rank owns T/N of the step's T tokens and
sends each one's k routed copies to the ranks of their experts (the **dispatch** all-to-all) and gets the
outputs back (the **combine** all-to-all): T*k*H bytes of the activation dtype per step over all ranks, T*k*H/N
per rank (``formulas.moe_all_to_all_bytes``; wire (N-1)/N, nccl-tests' alltoall convention). The MLP
all-reduce of the MoE layers is dropped; the attention all-reduce keeps its volume (as a reduce-scatter that
hands each rank its T/N rows plus the all-gather that assembles them for the next layer, the same 2(N-1)/N).
A model with shared experts keeps one all-reduce of [T, H] per MoE layer for their (tensor-parallel) partial
sums. Counted as under --tp (an upper bound): the norms and the router run on all T rows on every rank.
The router (and its biases) is replicated: every rank routes the same rows the same way.

Latent attention (DeepSeek's MLA) under --tp, as vLLM: the heads split (q_proj / q_b_proj and kv_b_proj
column-parallel by whole heads, o_proj row-parallel by heads: its all-reduce is the attention one), while
q_a_proj, kv_a_proj_with_mqa, their norms and the latent cache (c_kv and the rope key, shared by every
head) are replicated: every rank projects, appends and reads the whole latent. MLA has no KV heads to
split, so only its query heads bound --tp.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import formulas as F
from .dtypes import bytes_per_element
from .errors import RooflineError

COLLECTIVE_OPS = ("embedding_allreduce", "attn_allreduce", "mlp_allreduce", "lm_head_gather")
PER_LAYER_COLLECTIVES = ("attn_allreduce", "mlp_allreduce")
EP_COLLECTIVES = ("moe_dispatch", "moe_combine")    # expert parallelism's two all-to-alls per MoE layer
COLLECTIVE_KIND = {"embedding_allreduce": "all_reduce", "attn_allreduce": "all_reduce",
                   "mlp_allreduce": "all_reduce", "lm_head_gather": "all_gather",
                   "moe_dispatch": "all_to_all", "moe_combine": "all_to_all"}


@dataclass(frozen=True)
class Shard:
    """The sizes one rank holds (all ranks hold the same sizes)."""

    tp: int
    hidden: int
    head_dim: int
    n_heads: int        # query heads per rank
    n_kv_heads: int     # KV heads per rank (1 when replicated)
    kv_replicas: int    # ranks that hold each KV head (1 unless fewer KV heads than ranks)
    intermediate: int   # SwiGLU width per rank
    vocab: int          # embedding rows and lm_head columns per rank (of the padded vocabulary)
    vocab_padded: int   # vocab rounded up to a multiple of tp
    ep: int = 1             # expert-parallel ranks (1: experts sliced tensor-parallel; else = tp)
    n_experts: int = 0      # routed experts per rank: E under tp, E / ep under ep (0: dense)
    moe_intermediate: int = 0   # one routed expert's width per rank: moe_intermediate / tp, whole under ep

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def q_heads(self, rank: int) -> range:
        """Global indices of the query heads ``rank`` holds."""
        return range(rank * self.n_heads, (rank + 1) * self.n_heads)

    def kv_heads(self, rank: int) -> range:
        """Global indices of the KV heads ``rank`` holds: its own slice, or, replicated, the one its query
        heads use (rank // replicas)."""
        if self.kv_replicas > 1:
            h = rank // self.kv_replicas
            return range(h, h + 1)
        return range(rank * self.n_kv_heads, (rank + 1) * self.n_kv_heads)

    def columns(self, rank: int) -> range:
        """The intermediate features ``rank`` holds (gate/up columns, down rows)."""
        return range(rank * self.intermediate, (rank + 1) * self.intermediate)

    def experts(self, rank: int) -> range:
        """Global indices of the routed experts ``rank`` holds (all of them, sliced, unless expert parallel)."""
        if self.ep > 1:
            return range(rank * self.n_experts, (rank + 1) * self.n_experts)
        return range(self.n_experts)

    def vocab_rows(self, rank: int) -> range:
        """The (padded) vocabulary rows ``rank`` holds."""
        return range(rank * self.vocab, (rank + 1) * self.vocab)


def valid_tp(cfg) -> list:
    """Every rank count ``shard`` accepts for ``cfg``, up to its query head count."""
    return [n for n in range(1, cfg.n_heads + 1) if not _broken_rule(cfg, n)]


def _kv_heads(cfg) -> int:
    """The KV heads --tp splits: latent attention has none (one latent shared by every head, replicated), so its
    query heads alone bound --tp."""
    return cfg.n_heads if cfg.mla else cfg.n_kv_heads


def _broken_rule(cfg, tp: int, ep_sliced: bool = False) -> str:
    """The sharding rule ``tp`` breaks for ``cfg``, in words; "" when it splits."""
    Hq, Hkv, I = cfg.n_heads, _kv_heads(cfg), cfg.intermediate
    if Hq % tp:
        return f"its {Hq} attention heads do not divide into {tp} ranks (each rank holds whole heads)"
    if Hkv >= tp and Hkv % tp:
        return f"its {Hkv} KV heads do not divide into {tp} ranks"
    if Hkv < tp and tp % Hkv:
        return (f"with fewer KV heads ({Hkv}) than ranks each KV head is replicated on tp / {Hkv} ranks (as vLLM "
                f"does), so --tp must be a multiple of {Hkv}")
    if I % tp:
        return f"its intermediate size {I} does not divide into {tp} ranks"
    if cfg.n_experts and not ep_sliced and cfg.moe_intermediate % tp:
        return (f"its expert width {cfg.moe_intermediate} does not divide into {tp} ranks (each rank holds a slice "
                "of every expert; --ep holds whole experts instead)")
    if cfg.shared_intermediate % tp:
        return f"its shared-expert width {cfg.shared_intermediate} does not divide into {tp} ranks"
    if getattr(cfg, "qk_norm_whole", False) and tp > 1:
        return ("its qk-norm is over the whole q / k projection (OLMo-2), which a rank holding some of the heads "
                "does not compute alone (not modelled under tensor parallelism)")
    if getattr(cfg, "linear_layers", ()) and tp > 1:
        return "its Gated DeltaNet layers are not modelled under tensor parallelism yet (only --tp 1)"
    if getattr(cfg, "mamba_layers", ()) and tp > 1:
        return "its Mamba-2 layers are not modelled under tensor parallelism yet (only --tp 1)"
    return ""


def ranks(tp: int = 1, ep: int = 1) -> tuple:
    """(tp, ep) as ``shard`` takes them: --ep N alone means N ranks, attention tensor-parallel over the same N
    (one group: tp = ep = N); --tp N --ep N the same; --tp N alone experts sliced (ep = 1). Any other pair is
    a one-line RooflineError."""
    for name, v in (("--tp", tp), ("--ep", ep)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            what = "tensor" if name == "--tp" else "expert"
            raise RooflineError(f"{name} must be a whole number of {what}-parallel ranks, at least 1, but {v!r} was "
                                "given.")
    if ep > 1 and tp == 1:
        return ep, ep
    if ep > 1 and ep != tp:
        raise RooflineError(f"--tp {tp} with --ep {ep}: the expert-parallel ranks are the tensor-parallel ranks (one "
                            f"group; data-parallel attention is not modelled), so --ep must be 1 or equal --tp: give "
                            f"--tp {ep} --ep {ep} (or --ep {ep} alone) or --tp {tp} alone.")
    return tp, ep


def valid_ep(cfg) -> list:
    """Every expert-parallel size ``shard`` accepts for ``cfg`` (1: experts sliced under --tp)."""
    if not cfg.n_experts:
        return [1]
    return [1] + [n for n in range(2, cfg.n_experts + 1) if not cfg.n_experts % n and not _broken_rule(cfg, n, True)]


def shard(cfg, tp: int, ep: int = 1) -> Shard:
    """Per-rank sizes of ``cfg`` over ``tp`` ranks (experts sliced), or with ``ep`` = ``tp`` (whole experts, E/ep
    per rank); a one-line RooflineError names the rule and the valid sizes."""
    tp, ep = ranks(tp, ep)
    E = cfg.n_experts
    if ep > 1 and not E:
        raise RooflineError(f"--ep {ep} needs a mixture of experts, but {cfg.name} has no routed experts: use --tp "
                            f"{ep} for tensor parallelism.")
    if ep > 1 and E % ep:
        ok = ", ".join(map(str, valid_ep(cfg)))
        raise RooflineError(f"--ep {ep} cannot split {cfg.name}'s {E} experts into whole experts per rank ({ep} does "
                            f"not divide {E}). Valid --ep for it: {ok}.")
    rule = _broken_rule(cfg, tp, ep > 1)
    if rule:
        if ep > 1:
            ok = ", ".join(map(str, valid_ep(cfg)))
            raise RooflineError(f"--ep {ep} runs attention tensor-parallel over the same {ep} ranks, and they cannot "
                                f"split {cfg.name}: {rule}. Valid --ep for it: {ok}.")
        ok = ", ".join(map(str, valid_tp(cfg)))
        raise RooflineError(f"--tp {tp} cannot split {cfg.name}: {rule}. Valid --tp for it: {ok}.")
    Hq, Hkv, I = cfg.n_heads, _kv_heads(cfg), cfg.intermediate
    padded = -(-cfg.vocab // tp) * tp
    return Shard(tp=tp, hidden=cfg.hidden, head_dim=cfg.head_dim, n_heads=Hq // tp,
                 n_kv_heads=max(1, Hkv // tp), kv_replicas=max(1, tp // Hkv), intermediate=I // tp,
                 vocab=padded // tp, vocab_padded=padded, ep=ep, n_experts=E // ep if E else 0,
                 moe_intermediate=(cfg.moe_intermediate if ep > 1 else cfg.moe_intermediate // tp) if E else 0)


@dataclass(frozen=True)
class CollectiveCost:
    """One collective of a step: ``launches`` calls per instance, ``count`` instances per step (n_layers
    for the per-layer all-reduces, the MoE layers for the all-to-alls), ``message_bytes`` per instance summed over its launches (prefill
    chunks). The message of an all-gather is its gathered output."""

    name: str
    kind: str             # "all_reduce" | "all_gather" | "all_to_all"
    message_bytes: float  # one instance (all its launches)
    launches: int         # collective calls per instance
    count: int            # instances per step
    ranks: int
    shape: str            # the tensor, in words: "[T=8, 4096] bf16"

    @property
    def wire_bytes(self) -> float:
        """Bytes one rank sends per instance (ring volume: ``formulas.collective_bytes``)."""
        return F.collective_bytes(self.kind, self.message_bytes, self.ranks)

    @property
    def total_wire_bytes(self) -> float:
        return self.wire_bytes * self.count

    def time(self, link) -> float:
        """One instance's seconds over ``link`` (an Interconnect): latency per launch + wire bytes / bandwidth."""
        return link.time(self.kind, self.message_bytes, self.ranks, self.launches)


def step_collectives(cfg, sh: Shard, batch: int, chunks, act_dtype: str) -> tuple:
    """The collectives of one step over ``sh.tp`` ranks (none for one rank).

    Per chunk of c new tokens per sequence (T = batch x c rows): the embedding's all-reduce and two per
    layer, of [T, H] in the activation dtype; once per step the all-gather of the last position's logits
    [batch, V_padded] (prefill computes logits for the last chunk only). Under expert parallelism
    (``sh.ep`` > 1) each MoE layer trades its MLP all-reduce (kept for shared experts' partial sums) for a
    dispatch and a combine all-to-all of T*k*H / N per rank (``formulas.moe_all_to_all_bytes``).
    """
    if sh.tp == 1:
        return ()
    a = bytes_per_element(act_dtype)
    rows = sum(batch * c for c in chunks)
    n = len(chunks)
    hid = rows * cfg.hidden * a
    what = f"[T={rows:,}, {cfg.hidden:,}] {act_dtype}" + (f" in {n} chunks" if n > 1 else "")
    out = [CollectiveCost("embedding_allreduce", "all_reduce", hid, n, 1, sh.tp, what)]
    moe = len(cfg.moe_layers) if sh.ep > 1 else 0
    mlp = cfg.n_layers - moe + (moe if cfg.shared_intermediate else 0)
    out.append(CollectiveCost("attn_allreduce", "all_reduce", hid, n, cfg.n_layers, sh.tp, what))
    if mlp:
        out.append(CollectiveCost("mlp_allreduce", "all_reduce", hid, n, mlp, sh.tp, what))
    if moe:
        k = cfg.n_active
        msg = sum(F.moe_all_to_all_bytes(batch * c, k, cfg.hidden, sh.ep, act_dtype=act_dtype) for c in chunks)
        per = rows * k / sh.ep
        shape = (f"[T*k/N={per:,.4g}, {cfg.hidden:,}] {act_dtype}" + (f" in {n} chunks" if n > 1 else ""))
        out += [CollectiveCost(name, "all_to_all", msg, n, moe, sh.ep, shape) for name in EP_COLLECTIVES]
    out.append(CollectiveCost("lm_head_gather", "all_gather", batch * sh.vocab_padded * a, 1, 1, sh.tp,
                              f"[{batch:,}, {sh.vocab_padded:,}] {act_dtype}"))
    return tuple(out)


def collective_op_count(name: str, n_layers: int) -> int:
    return int(n_layers) if name in PER_LAYER_COLLECTIVES else 1
