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
"""

from __future__ import annotations

from dataclasses import dataclass

from . import formulas as F
from .dtypes import bytes_per_element
from .errors import RooflineError

COLLECTIVE_OPS = ("embedding_allreduce", "attn_allreduce", "mlp_allreduce", "lm_head_gather")
PER_LAYER_COLLECTIVES = ("attn_allreduce", "mlp_allreduce")
COLLECTIVE_KIND = {"embedding_allreduce": "all_reduce", "attn_allreduce": "all_reduce",
                   "mlp_allreduce": "all_reduce", "lm_head_gather": "all_gather"}


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

    def vocab_rows(self, rank: int) -> range:
        """The (padded) vocabulary rows ``rank`` holds."""
        return range(rank * self.vocab, (rank + 1) * self.vocab)


def valid_tp(cfg) -> list:
    """Every rank count ``shard`` accepts for ``cfg``, up to its query head count."""
    return [n for n in range(1, cfg.n_heads + 1) if not _broken_rule(cfg, n)]


def _broken_rule(cfg, tp: int) -> str:
    """The sharding rule ``tp`` breaks for ``cfg``, in words; "" when it splits."""
    Hq, Hkv, I = cfg.n_heads, cfg.n_kv_heads, cfg.intermediate
    if Hq % tp:
        return f"its {Hq} attention heads do not divide into {tp} ranks (each rank holds whole heads)"
    if Hkv >= tp and Hkv % tp:
        return f"its {Hkv} KV heads do not divide into {tp} ranks"
    if Hkv < tp and tp % Hkv:
        return (f"with fewer KV heads ({Hkv}) than ranks each KV head is replicated on tp / {Hkv} ranks (as vLLM "
                f"does), so --tp must be a multiple of {Hkv}")
    if I % tp:
        return f"its intermediate size {I} does not divide into {tp} ranks"
    return ""


def shard(cfg, tp: int) -> Shard:
    """Per-rank sizes of ``cfg`` over ``tp`` ranks, or a one-line RooflineError naming the rule and the valid sizes."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise RooflineError(f"--tp must be a whole number of tensor-parallel ranks, at least 1, but {tp!r} was given.")
    rule = _broken_rule(cfg, tp)
    if rule:
        ok = ", ".join(map(str, valid_tp(cfg)))
        raise RooflineError(f"--tp {tp} cannot split {cfg.name}: {rule}. Valid --tp for it: {ok}.")
    Hq, Hkv, I = cfg.n_heads, cfg.n_kv_heads, cfg.intermediate
    padded = -(-cfg.vocab // tp) * tp
    return Shard(tp=tp, hidden=cfg.hidden, head_dim=cfg.head_dim, n_heads=Hq // tp,
                 n_kv_heads=max(1, Hkv // tp), kv_replicas=max(1, tp // Hkv), intermediate=I // tp,
                 vocab=padded // tp, vocab_padded=padded)


@dataclass(frozen=True)
class CollectiveCost:
    """One collective of a step: ``launches`` calls per instance, ``count`` instances per step (n_layers
    for the per-layer all-reduces), ``message_bytes`` per instance summed over its launches (prefill
    chunks). The message of an all-gather is its gathered output."""

    name: str
    kind: str             # "all_reduce" | "all_gather"
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
    [batch, V_padded] (prefill computes logits for the last chunk only).
    """
    if sh.tp == 1:
        return ()
    a = bytes_per_element(act_dtype)
    rows = sum(batch * c for c in chunks)
    n = len(chunks)
    hid = rows * cfg.hidden * a
    what = f"[T={rows:,}, {cfg.hidden:,}] {act_dtype}" + (f" in {n} chunks" if n > 1 else "")
    out = [CollectiveCost("embedding_allreduce", "all_reduce", hid, n, 1, sh.tp, what)]
    out += [CollectiveCost(name, "all_reduce", hid, n, cfg.n_layers, sh.tp, what) for name in PER_LAYER_COLLECTIVES]
    out.append(CollectiveCost("lm_head_gather", "all_gather", batch * sh.vocab_padded * a, 1, 1, sh.tp,
                              f"[{batch:,}, {sh.vocab_padded:,}] {act_dtype}"))
    return tuple(out)


def collective_op_count(name: str, n_layers: int) -> int:
    return int(n_layers) if name in PER_LAYER_COLLECTIVES else 1
