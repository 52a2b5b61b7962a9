"""The model's tensor-parallel mode: the same seeded weights, sharded per rank; collectives through torch.distributed.

    from kernels.tp import TPGroup
    m = LlamaModel(cfg, dtype="fp32", backend="torch", tp=TPGroup(rank, world))   # inside an initialised group

Every rank builds the full weights from the same seed (``kernels.model.init_weights``) and keeps
its slice (``shard_weights``), so TP=N logits equal TP=1 logits up to the rounding of the
all-reduce's partial sums. The split is ``roofline.parallel``'s (Megatron, as vLLM): q/k/v and
gate/up column-parallel (whole heads; KV heads replicated when fewer than ranks), o/down
row-parallel with an all-reduce of [T, H] after each, the embedding vocab-parallel (masked
gather + all-reduce) and lm_head vocab-parallel (local logits + all-gather, padding dropped).
Norms and residual adds are replicated. ``layer_config`` is the per-rank ModelConfig the
layers run with (local heads and intermediate size).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from roofline.layer import model_ops
from roofline.models import ModelConfig
from roofline.parallel import Shard, shard


@dataclass
class TPGroup:
    """This process's place in a tensor-parallel group: ``rank`` of ``world``, over ``group`` (None: the
    default torch.distributed group). The collectives are the only place the model communicates."""

    rank: int
    world: int
    group: object = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place (the row-parallel linears' partial sums)."""
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dimension, in rank order (vocab-parallel logits)."""
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def layer_config(cfg: ModelConfig, sh: Shard, rank: int = 0) -> ModelConfig:
    """The sizes one rank's layers run with: its query and KV heads, its intermediate slice, its vocab rows."""
    if sh.tp == 1:
        return cfg
    return replace(cfg, name=f"{cfg.name} (rank {rank} of {sh.tp})", n_heads=sh.n_heads, n_kv_heads=sh.n_kv_heads,
                   intermediate=sh.intermediate, head_dim=cfg.head_dim, vocab=sh.vocab)


def _rows(t: torch.Tensor, idx: range, width: int) -> torch.Tensor:
    return t[idx.start * width: idx.stop * width]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``rows`` (a vocabulary padded to a multiple of the ranks)."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def _slice(t: torch.Tensor, rule: str, sh: Shard, rank: int, D: int) -> torch.Tensor:
    """Rank ``rank``'s part of one weight by its WeightSpec shard rule (roofline.layer): columns (the last
    dimension: a linear's outputs, or a bias) by query heads, KV heads or intermediate features; rows (a
    row-parallel linear's inputs); "rank0" keeps a row-parallel bias on rank 0 only (it is added once, to the
    partial sums before the all-reduce); "replicated" copies."""
    last = lambda idx, width: t[..., idx.start * width: idx.stop * width]  # noqa: E731
    if rule == "q_cols":
        return last(sh.q_heads(rank), D)
    if rule == "kv_cols":
        return last(sh.kv_heads(rank), D)
    if rule == "i_cols":
        return last(sh.columns(rank), 1)
    if rule == "q_rows":
        return _rows(t, sh.q_heads(rank), D)
    if rule == "i_rows":
        return _rows(t, sh.columns(rank), 1)
    if rule == "rank0":
        return t if rank == 0 else torch.zeros_like(t)
    return t


def shard_weights(cfg: ModelConfig, w: dict, sh: Shard, rank: int) -> dict:
    """Rank ``rank``'s slice of the full weights ``w`` (``init_weights``'s layout: linear [in, out]), copied
    so the full set can be freed. Each per-layer weight is split by its WeightSpec's shard rule."""
    if sh.tp == 1:
        return w
    D = cfg.head_dim
    keep = lambda t: t.contiguous().clone()  # noqa: E731 - a copy, not a view of the full tensor
    rules = {ws.key: ws.shard for o in model_ops(cfg) if o.per_layer for ws in o.weights}
    out = {"final_norm": w["final_norm"].clone(), "layers": []}
    for lw in w["layers"]:
        out["layers"].append({k: keep(_slice(t, rules[k], sh, rank, D)) for k, t in lw.items()})
    vocab = sh.vocab_rows(rank)
    out["embed"] = keep(_rows(_pad_rows(w["embed"], sh.vocab_padded), vocab, 1))
    if cfg.tie_embeddings:
        out["lm_head"] = out["embed"].t()
    else:
        out["lm_head"] = keep(_rows(_pad_rows(w["lm_head"].t(), sh.vocab_padded), vocab, 1).t())
    return out


def embed_local(ops, ids: torch.Tensor, table: torch.Tensor, rows: range) -> torch.Tensor:
    """This rank's part of a vocab-parallel embedding: the rows it holds gathered, the others zero."""
    mask = (ids >= rows.start) & (ids < rows.stop)
    local = torch.where(mask, ids - rows.start, torch.zeros_like(ids))
    x = ops.embedding(local, table)
    return x.masked_fill_(~mask[:, None], 0)


def embed(ops, ids: torch.Tensor, table: torch.Tensor, rows: range, tp: TPGroup) -> torch.Tensor:
    """Vocab-parallel embedding: ``embed_local`` on every rank, then an all-reduce sums the parts."""
    return tp.all_reduce(embed_local(ops, ids, table, rows))


def tp_parts(cfg: ModelConfig, tp: TPGroup | None):
    """(Shard, the per-rank layer config) for ``tp`` (one rank: the model's own sizes)."""
    sh = shard(cfg, tp.world if tp is not None else 1)
    return sh, layer_config(cfg, sh, tp.rank if tp is not None else 0)
