"""The model's tensor-parallel mode: the same seeded weights, sharded per rank; collectives through torch.distributed.

    from kernels.tp import TPGroup
    m = LlamaModel(cfg, dtype="fp32", backend="torch", tp=TPGroup(rank, world))   # inside an initialised group

Every rank builds the full weights from the same seed (``kernels.weights.init_weights``) and keeps
its slice (``shard_weights``), so TP=N logits equal TP=1 logits up to the rounding of the
all-reduce's partial sums. The split is ``roofline.parallel``'s (Megatron, as vLLM): q/k/v and
gate/up column-parallel (whole heads; KV heads replicated when fewer than ranks), o/down
row-parallel with an all-reduce of [T, H] after each, the embedding vocab-parallel (masked
gather + all-reduce) and lm_head vocab-parallel (local logits + all-gather, padding dropped).
Norms and residual adds are replicated. ``layer_config`` is the per-rank ModelConfig the
layers run with (local heads and intermediate size).

Mixtures of experts (as vLLM's tensor-parallel fused MoE): every rank holds every routed expert with its
intermediate dimension split (gate/up [E, H, I/N] column slices, down [E, I/N, H] row slices, a down bias on
rank 0 only), the router (and DeepSeek's correction bias, GPT-OSS's router bias) replicated, so every rank
routes the same replicated rows to the same experts; the shared expert is a column/row-parallel MLP of width
S/N and Qwen2-MoE's sigmoid gate is replicated (it scales the partial sums, which is linear). One all-reduce
sums the routed and shared partial outputs of a layer. Latent attention (DeepSeek's MLA): the heads split
(q_proj or q_b_proj and kv_b_proj column-parallel by whole heads of nope + rope and nope + v columns, o_proj
row-parallel by heads of v rows); q_a_proj, kv_a_proj_with_mqa, their norms and the latent cache (c_kv and
the rope key) are replicated, every rank writing the same latents.

Expert parallelism (``TPGroup(rank, world, ep=world)``, ``roofline.parallel``'s ``shard(cfg, N, N)``): attention,
norms, the router, dense layers and shared experts exactly as under --tp N; each rank holds E/N whole experts
(``e_whole``: rank r experts r*E/N ..). ``ep_experts`` replaces the routed grouped GEMM: every rank routed the same
replicated rows the same way, rank r owns the contiguous rows ``own_rows(T, N, r)`` and sends each owned token's k
(token, expert) rows to the rank holding the expert (the dispatch ``all_to_all_single``: gloo and NCCL have it),
runs the rows it received through its own experts (each row weighted by its routing weight), sends the outputs back
(the combine all-to-all) and sums each owned token's k partials. Its [T, H] output holds the owned rows (zeros
elsewhere), so the layer's MLP all-reduce assembles them (and adds the shared expert's partial sums). NB: the cost
model instead counts the attention all-reduce as a reduce-scatter + all-gather around the MoE block and drops the
MLP all-reduce of a model without shared experts; this forward keeps it (one [T, H] all-reduce per MoE layer more
on the wire than the model's step), while ``kernels.runners`` times the model's collectives.

Quantized weights (``kernels.quant``): every rank quantizes the full weights, then keeps its shard cut from the
quantized values (``_slice_quant``), so each rank holds exact rows of the one-rank quantization and TP=N logits
equal the one-rank quantized model's. The cut is the format's (``kernels.quant.slice_quant``: the registry's
``slice``, every format): per-output-channel scales (int8, fp8) follow a column split and stay whole on a row split
(quantizing a row shard on its own would take the absmax over half of K: other scales), a per-tensor one stays
whole on both; int4's [K/g, N] groups, FP4's micro-blocks and fp8's 128 x 128 blocks follow their axes, a shard
keeping whole ones (``kernels.quant.check_tp_scales`` refuses a --tp that would cut one, in one line). An 8-bit KV cache needs nothing here: each rank's cache holds its KV heads, with its
own per-token scales.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from roofline.layer import model_ops
from roofline.models import ModelConfig
from roofline.parallel import Shard, shard

from .quant import ABSORBED_KV_B, pad_out, slice_quant
from .quant_weight import QuantExperts, QuantWeight


@dataclass
class TPGroup:
    """This process's place in a tensor-parallel group: ``rank`` of ``world``, over ``group`` (None: the
    default torch.distributed group). The collectives are the only place the model communicates."""

    rank: int
    world: int
    group: object = None
    ep: int = 1          # expert-parallel ranks: 1 (experts sliced) or ``world`` (E / world whole experts per rank)

    def all_to_all(self, x: torch.Tensor, out_splits: list, in_splits: list) -> torch.Tensor:
        """Rows of ``x`` to every rank: ``in_splits[s]`` consecutive rows to rank s; returns the rows received,
        ``out_splits[s]`` from rank s, in rank order (``torch.distributed.all_to_all_single``)."""
        import torch.distributed as dist

        out = x.new_empty(sum(out_splits), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), [int(v) for v in out_splits], [int(v) for v in in_splits],
                               group=self.group)
        return out

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
                   intermediate=sh.intermediate, head_dim=cfg.head_dim, vocab=sh.vocab,
                   moe_intermediate=sh.moe_intermediate, shared_intermediate=cfg.shared_intermediate // sh.tp)


def _rows(t: torch.Tensor, idx: range, width: int) -> torch.Tensor:
    return t[idx.start * width: idx.stop * width]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``rows`` (a vocabulary padded to a multiple of the ranks)."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


# Rules that split one dimension of a weight into N equal parts, rank r keeping part r: the dimension (our
# layout: linear [in, out], experts [E, in, out], bias / vector [out]). Column rules split the outputs (the last
# dimension: whole query heads of D, or of nope + rope / nope + v under MLA; intermediate features; a sink per
# query head); row rules a row-parallel linear's inputs (dimension 0, or 1 of an [E, I, H] expert tensor).
EVEN_SPLITS = {"q_cols": -1, "i_cols": -1, "e_cols": -1, "mla_q_cols": -1, "mla_kv_cols": -1, "q_heads": -1,
               "q_rows": 0, "i_rows": 0, "mla_o_rows": 0, "e_rows": 1}


def _even(t: torch.Tensor, dim: int, parts: int, rank: int) -> torch.Tensor:
    n = t.shape[dim] // parts
    return t.narrow(dim, rank * n, n)


def _slice_quant(q, rule: str, sh: Shard, rank: int, D: int):
    """Rank ``rank``'s part of a quantized weight (``kernels.quant``: QuantWeight [K, N], QuantExperts [E, K, N])
    by the same rules as a float one, cut from the quantized values (``slice_quant``, the format's own cut), so
    every rank holds exact rows of the one-rank quantization: a column rule slices N (values and scales), a row rule
    K (per-channel scales stay whole; groups and blocks stay whole), "e_whole" the experts."""
    if rule == "replicated":
        return q
    if rule in EVEN_SPLITS:
        d = EVEN_SPLITS[rule] % len(q.shape)
        axis = "out" if d == len(q.shape) - 1 else "in"
        n = q.shape[d] // sh.tp
        return slice_quant(q, axis, rank * n, (rank + 1) * n)
    if rule == "kv_cols":
        idx = sh.kv_heads(rank)
        return slice_quant(q, "out", idx.start * D, idx.stop * D)
    if rule == "e_whole":
        idx = sh.experts(rank)
        return slice_quant(q, "experts", idx.start, idx.stop)
    raise ValueError(f"weight shard rule {rule!r} has no split of a quantized weight in kernels.tp: give it one in "
                     f"_slice_quant (known: {', '.join([*EVEN_SPLITS, 'kv_cols', 'e_whole', 'replicated'])}).")


def _slice(t: torch.Tensor, rule: str, sh: Shard, rank: int, D: int) -> torch.Tensor:
    """Rank ``rank``'s part of one weight by its WeightSpec shard rule (roofline.layer): ``EVEN_SPLITS``
    (whole heads or features, equal parts); "kv_cols" by the KV heads the rank holds (one, replicated, when
    there are fewer KV heads than ranks); "rank0" keeps a row-parallel bias on rank 0 only (it is added once, to
    the partial sums before the all-reduce); "e_whole" the rank's whole experts (expert parallelism);
    "replicated" copies. Any other rule is a ValueError (a new rule must say how it splits). A quantized weight
    goes to ``_slice_quant``."""
    if isinstance(t, (QuantWeight, QuantExperts)):
        return _slice_quant(t, rule, sh, rank, D)
    if rule in EVEN_SPLITS:
        return _even(t, EVEN_SPLITS[rule], sh.tp, rank)
    if rule == "kv_cols":
        idx = sh.kv_heads(rank)
        return t[..., idx.start * D: idx.stop * D]
    if rule == "rank0":
        return t if rank == 0 else torch.zeros_like(t)
    if rule == "e_whole":
        idx = sh.experts(rank)
        return t[idx.start: idx.stop]
    if rule == "replicated":
        return t
    raise ValueError(f"weight shard rule {rule!r} has no split in kernels.tp: give it one in _slice "
                     f"(known: {', '.join([*EVEN_SPLITS, 'kv_cols', 'rank0', 'e_whole', 'replicated'])}).")


def shard_weights(cfg: ModelConfig, w: dict, sh: Shard, rank: int) -> dict:
    """Rank ``rank``'s slice of the full weights ``w`` (``init_weights``'s layout: linear [in, out]), copied
    so the full set can be freed. Each per-layer weight is split by its WeightSpec's shard rule. Weights already
    quantized (``kernels.quant.quantize_model_weights`` on the full set) are cut from their quantized values
    (``_slice_quant``; latent attention's dequantized kv_b_proj copy as kv_b_proj), lm_head by vocab columns;
    the caller prepares them for the torch backend after (``prepare_model_torch``)."""
    if sh.tp == 1:
        return w
    D = cfg.head_dim
    keep = lambda t: t if isinstance(t, (QuantWeight, QuantExperts)) else t.contiguous().clone()  # noqa: E731
    rules = {ws.key: ws.shard for o in model_ops(cfg, sh if sh.ep > 1 else None) if o.per_layer for ws in o.weights}
    if "wkv_b" in rules:
        rules[ABSORBED_KV_B] = rules["wkv_b"]
    out = {"final_norm": w["final_norm"].clone(), "layers": []}
    for lw in w["layers"]:
        out["layers"].append({k: keep(_slice(t, rules[k], sh, rank, D)) for k, t in lw.items()})
    vocab = sh.vocab_rows(rank)
    out["embed"] = keep(_rows(_pad_rows(w["embed"], sh.vocab_padded), vocab, 1))
    if isinstance(w["lm_head"], QuantWeight):          # its own quantized copy, tied or not: vocab columns
        out["lm_head"] = slice_quant(pad_out(w["lm_head"], sh.vocab_padded), "out", vocab.start, vocab.stop)
    elif cfg.tie_embeddings:
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
    """(Shard, the per-rank layer config) for ``tp`` (one rank: the model's own sizes; ``tp.ep`` > 1: whole
    experts)."""
    sh = shard(cfg, tp.world if tp is not None else 1, getattr(tp, "ep", 1) if tp is not None else 1)
    return sh, layer_config(cfg, sh, tp.rank if tp is not None else 0)


def own_rows(T: int, world: int, rank: int) -> range:
    """The rows of a step's T rows that ``rank`` owns under expert parallelism: contiguous, sizes differing by at
    most one (``torch.tensor_split``'s), rank 0 first."""
    base, extra = divmod(T, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


@dataclass
class Dispatch:
    """One MoE layer's routing as every rank sees it (the router is replicated): what this rank sends and gets."""

    order: torch.Tensor       # this rank's owned (token, slot) pairs, flattened, sorted by destination rank
    token: torch.Tensor       # the owned token (local row) of each pair, in ``order``
    send: list                # rows this rank sends to each rank (dispatch in_splits = combine out_splits)
    recv: list                # rows this rank gets from each rank (dispatch out_splits = combine in_splits)
    recv_ids: torch.Tensor    # the received rows' experts, local to this rank (0 .. E/N - 1)
    recv_w: torch.Tensor      # the received rows' routing weights [rows, 1]
    recv_tok: torch.Tensor    # the received rows' tokens (global rows of the step)


def dispatch_plan(weights: torch.Tensor, ids: torch.Tensor, world: int, rank: int, local: int) -> Dispatch:
    """The dispatch of routing (``weights``, ``ids``: [T, k], the same on every rank) for ``rank`` of ``world``
    ranks holding ``local`` experts each: the rows of every rank's owned tokens whose expert this rank holds, in
    the order the all-to-all delivers them (each sender's pairs stably sorted by destination)."""
    T, k = ids.shape
    dest = torch.div(ids, local, rounding_mode="floor")
    mine = own_rows(T, world, rank)
    d_own = dest[mine.start:mine.stop].reshape(-1)
    order = torch.sort(d_own, stable=True).indices
    token = torch.arange(len(mine), device=ids.device).repeat_interleave(k)[order]
    send = torch.bincount(d_own, minlength=world).tolist()
    recv, r_ids, r_w, r_tok = [], [], [], []
    for s in range(world):
        rows = own_rows(T, world, s)
        hit = dest[rows.start:rows.stop].reshape(-1) == rank
        recv.append(int(hit.sum()))
        r_ids.append(ids[rows.start:rows.stop].reshape(-1)[hit] - rank * local)
        r_w.append(weights[rows.start:rows.stop].reshape(-1)[hit])
        r_tok.append(torch.arange(rows.start, rows.stop, device=ids.device).repeat_interleave(k)[hit])
    return Dispatch(order, token, send, recv, torch.cat(r_ids), torch.cat(r_w)[:, None], torch.cat(r_tok))


def local_experts(moe, rank: int, h, w_gate, w_up, w_down, weights, ids, **kw) -> torch.Tensor:
    """The routed experts of one rank with no communication (the "layer" runner under expert parallelism): the
    (token, expert) rows whose expert ``rank`` holds, through its experts, summed per token ([T, H])."""
    local = w_gate.shape[0]
    hit = torch.div(ids, local, rounding_mode="floor") == rank
    tok = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(ids)[hit]
    out = h.new_zeros(h.shape)
    if tok.numel():
        y = moe(h[tok], w_gate, w_up, w_down, weights[hit][:, None], (ids[hit] - rank * local)[:, None], **kw)
        out.index_add_(0, tok, y)
    return out


def ep_experts(moe, tp: TPGroup, h, w_gate, w_up, w_down, weights, ids, **kw) -> torch.Tensor:
    """The routed experts under expert parallelism (module docstring): dispatch all-to-all, this rank's E/N
    experts on the rows they got (``moe``: the backend's ``moe_experts``, k = 1 per row), combine all-to-all, the
    sum of each owned token's k partials. Returns [T, H]: this rank's owned rows, zeros elsewhere."""
    T, H = h.shape
    local = w_gate.shape[0]
    p = dispatch_plan(weights, ids, tp.world, tp.rank, local)
    mine = own_rows(T, tp.world, tp.rank)
    got = tp.all_to_all(h[mine.start:mine.stop][p.token], p.recv, p.send)                  # dispatch
    if got.shape[0]:
        y = moe(got, w_gate, w_up, w_down, p.recv_w, p.recv_ids[:, None], **kw)
    else:
        y = got.new_zeros(0, H)
    back = tp.all_to_all(y, p.send, p.recv)                                                 # combine
    out = h.new_zeros(T, H)
    own = torch.zeros(len(mine), H, dtype=torch.float32, device=h.device).index_add_(0, p.token, back.float())
    out[mine.start:mine.stop] = own.to(h.dtype)
    return out
