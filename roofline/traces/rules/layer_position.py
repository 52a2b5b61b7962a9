"""Kernels of a CUDA-graph replay with no capture, sized by their position in ``--model``'s layer sequence.

A replayed kernel carries no op and no shapes (SGLang and vLLM decode as graph replays). A decode step's kernels
repeat per layer, so where the whole replay follows ``--model``'s op list (``roofline.layer.model_ops``) as an
engine runs it, each kernel's place says which op it is, and the step annotation says its rows
(``step[DECODE bs=8]``: 8 tokens). The op list as SGLang fuses it (``models/qwen3.py`` at commit 01b5f572,
``models/utils.py``'s ``apply_qk_norm`` at a0e6a9ad; an engine that fuses the same way matches too):

* the embedding gather (one kernel of the copy family: ``indexSelect*``);
* per layer: the input norm (plain RMSNorm in layer 0, the residual add fused into it after: the name says
  "add"), the q, k and v projections as one GEMM (``QKVParallelLinear``, [T, H] x [H, q + 2 kv]), the q and k
  norms over [T * heads, D] (two norm kernels; with ``alt_stream`` under capture the k norm runs on the second
  stream, so the kernel on the replay's main stream is q's, whatever their order; or one kernel of both,
  ``fused_inplace_qknorm``), the rope, the KV write (one ``kv_write`` kernel, or two copies: k and v, as
  ``set_kv_buffer``'s index_put_), the attention kernel(s) (costed by their own rule from the step mix, not
  here), o_proj, the post-attention norm (residual add fused), gate and up as one GEMM
  (``MergedColumnParallelLinear``), the activation, down_proj;
* the final norm (residual add fused), the lm_head GEMM.

Each kernel's FLOPs and bytes are then ``roofline.formulas``' for that op at the step's tokens, in the run's dtype,
the rule's note says it was sized by position. The replay is sized only when every kernel, in order, has the
category its place wants (``kernel_names``' families): anything else (another model's layers, a layer the engine
fused otherwise, a split-K GEMM's second kernel, an all-reduce under tensor parallelism, a quantized checkpoint, a
model with MoE, MLA or other kinds of ops, a step that does not say its tokens) leaves the whole replay uncosted,
said in the trace's notes with the first kernel that differs: a position is never guessed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ... import formulas as F
from ...layer import model_ops
from ..registry import kernel_rule_for, rule
from .kernel_names import KERNEL_NAMES

SIZED = "sized by position"
_MEMO: dict = {}                      # (ReplayKernels, model, tokens, dtype) -> [Sized | None] or a reason


@dataclass(frozen=True)
class Part:
    """One kernel a slot wants: its kernel-name family, and what it costs (None: its own rule costs it)."""

    family: str
    what: str = ""
    cost: object = None
    category: str = ""
    sig: str = ""
    detail: tuple = ()
    add: bool | None = None           # norms: the name must (True) / must not (False) say "add"
    many: bool = False                # one or more kernels of the family (attention and its combine)


@dataclass(frozen=True)
class Slot:
    what: str
    alternatives: tuple               # (Part, ...) per way the engine runs it, tried in order
    by_stream: bool = False           # two parts whose order the streams settle: the main stream's is the first


def _sig(*shapes, dt) -> str:
    return "x".join("[" + ",".join(map(str, s)) + "]" for s in shapes) + f" {dt}"


def _slots(cfg, T: int, dt: str):
    """The replay's slots for ``cfg`` at ``T`` tokens, or the reason this model has no such sequence here."""
    ops = model_ops(cfg)
    H = cfg.hidden
    out, pending = [], False

    def norm(what, rows, width, add):
        c = (F.add_rmsnorm if add else F.rmsnorm)(rows, width, act_dtype=dt, weight_dtype=dt)
        return Part("norm", what, c, "norm", _sig((rows, width), dt=dt), (("rows", rows), ("width", width)), add)

    def layer_ops(i):
        return [o for o in ops if o.per_layer and i in o.layers]

    stream = [(None, o) for o in ops if o.part == "pre"]
    for i in range(cfg.n_layers):
        stream += [(i, o) for o in layer_ops(i)]
    stream += [(None, o) for o in ops if o.part == "post"]
    j = 0
    while j < len(stream):
        layer, o = stream[j]
        nxt = stream[j + 1] if j + 1 < len(stream) and stream[j + 1][0] == layer else (None, None)
        at = f"layer {layer} {o.name}" if layer is not None else o.name
        d = o.dims
        if o.kind == "embedding":
            c = F.embedding(T, H, weight_dtype=dt, act_dtype=dt)
            out.append(Slot(at, ((Part("copy", at, c, "gather", _sig((d["vocab"], H), (T,), dt=dt)),),)))
        elif o.kind == "residual":
            if pending:
                return f"{at} follows another residual add with no norm between to fuse it into"
            pending = True
        elif o.kind == "norm" and o.name in ("q_norm", "k_norm"):
            nxt = nxt[1]
            if o.name != "q_norm" or nxt is None or nxt.name != "k_norm" or d["rows"] == 1:
                return f"{at}: only per-head q and k norms, q's then k's, have an engine kernel form here"
            q, k = norm(f"layer {layer} q_norm", T * d["rows"], d["width"], False), \
                norm(f"layer {layer} k_norm", T * nxt.dims["rows"], nxt.dims["width"], False)
            both = Part("norm", f"layer {layer} q_norm+k_norm", q.cost + k.cost, "norm",
                        f"{q.sig[:-len(dt) - 1]}+{k.sig}", (("rows", T * (d["rows"] + nxt.dims["rows"])),
                                                            ("width", d["width"])), False)
            out.append(Slot(f"layer {layer} q/k norms", ((q, k), (both,)), by_stream=True))
            j += 1
        elif o.kind == "norm":
            out.append(Slot(at, ((norm(at, T, d["width"], pending),),)))
            pending = False
        elif o.kind == "linear":
            group = [o]           # the projections of one input run as one GEMM (q, k, v; gate, up)
            while j + 1 < len(stream) and stream[j + 1][0] == layer and stream[j + 1][1].kind == "linear" and \
                    stream[j + 1][1].dims["in_features"] == d["in_features"] and layer is not None:
                j += 1
                group.append(stream[j][1])
            k, n = d["in_features"], sum(g.dims["out_features"] for g in group)
            bias = n if d.get("bias") else 0
            name = "+".join(g.name for g in group)
            what = f"layer {layer} {name}" if layer is not None else name
            c = F.gemm(T, k, n, a_dtype=dt, b_dtype=dt, out_dtype=dt, bias=bias, bias_dtype=dt if bias else None)
            out.append(Slot(what, ((Part("gemm", what, c, "gemm", _sig((T, k), (k, n), dt=dt),
                                         (("m", T), ("k", k), ("n", n), ("batch", 1))),),)))
        elif o.kind == "rope":
            hq, hkv, hd = d["n_heads"], d["n_kv_heads"], d["head_dim"]
            c = F.rope(T, hq, hkv, hd, act_dtype=dt)
            out.append(Slot(at, ((Part("rope", at, c, "rope", _sig((T, hq, hd), (T, hkv, hd), dt=dt)),),)))
        elif o.kind == "kv_append":
            hkv, hd = d["n_kv_heads"], d["head_dim"]
            one = Part("kv_write", at, F.kv_append(T, hkv, hd, act_dtype=dt, kv_dtype=dt, kv_scales=False), "kv_write",
                       _sig((T, hkv, hd), (T, hkv, hd), dt=dt))
            half = [Part("copy", f"{at} ({x})", F.copy(T * hkv * hd, src_dtype=dt, dst_dtype=dt), "kv_write",
                         _sig((T, hkv, hd), dt=dt)) for x in ("k", "v")]
            out.append(Slot(at, ((one,), tuple(half))))
        elif o.kind == "attention":
            out.append(Slot(at, ((Part("attention", at, many=True),),)))
        elif o.kind == "activation" and d.get("fn") in ("silu", "gelu_tanh"):
            f = F.swiglu if d["fn"] == "silu" else F.geglu
            out.append(Slot(at, ((Part("activation", at, f(T, d["width"], act_dtype=dt), "activation",
                                       _sig((T, 2 * d["width"]), dt=dt)),),)))
        else:
            return f"its op {o.name} ({o.kind}) has no engine kernel form here"
        j += 1
    if pending:
        return "its last residual add has no norm after it to fuse into"
    return out


def _family(name: str) -> str:
    """The kernel's family: the category of the rule its name matches first (``graphs.kernel_category``'s)."""
    r = kernel_rule_for(name)
    return r.categories[0] if r is not None else "other"


def _align(seq, slots) -> list | str:
    """[Part | None] per kernel of ``seq`` (``opcost.ReplayKernels``), or where the sequence leaves the slots."""
    names, fam = seq.names, [_family(n) for n in seq.names]
    main = Counter(seq.streams).most_common(1)[0][0]
    out, p = [None] * len(names), 0

    def fits(part, q):
        return q < len(names) and fam[q] == part.family and (
            part.add is None or ("add" in names[q].lower()) == part.add)

    for slot in slots:
        for alt in slot.alternatives:
            q, got = p, []
            for part in alt:
                if not fits(part, q):
                    break
                got.append((q, part))
                q += 1
                while part.many and fits(part, q):
                    got.append((q, None))
                    q += 1
            else:
                if slot.by_stream and len(got) == 2 and seq.streams[got[0][0]] != main and \
                        seq.streams[got[1][0]] == main:
                    got = [(got[0][0], got[1][1]), (got[1][0], got[0][1])]
                for q2, part in got:
                    out[q2] = part if part is not None and part.cost is not None else None
                p = q
                break
        else:
            want = " or ".join("+".join(x.family + ("" if x.add is None else " (add)" if x.add else " (no add)")
                                        for x in alt) for alt in slot.alternatives)
            found = f"{names[p][:60]!r} ({fam[p]})" if p < len(names) else "the end of the replay"
            return f"kernel {p + 1} of {len(names)} is {found} where {slot.what} ({want}) should run"
    if p != len(names):
        return f"{len(names) - p} kernel(s) follow the lm_head, from {names[p][:60]!r} ({fam[p]})"
    return out


def _sized(seq, cfg, T: int, dt: str):
    key = (seq, cfg, T, dt)
    hit = _MEMO.get(key)
    if hit is None:
        if len(_MEMO) > 256:
            _MEMO.clear()
        slots = _slots(cfg, T, dt)
        hit = _MEMO[key] = slots if isinstance(slots, str) else _align(seq, slots)
    return hit


def by_position(a):
    """A replayed kernel's cost by its place in ``--model``'s layer sequence (the module docstring), or None."""
    seq, cfg, step = a.replay, a.model, a.step
    if seq is None or a.position is None or cfg is None:
        return None
    lead = f"graph replay of {len(seq.names)} kernels (no capture) not sized by position on {cfg.name}"
    if step is None or not step.tokens:
        a.say(f"{lead}: no engine step annotation says its tokens; its GEMMs and norms stay uncosted.")
        return None
    if cfg.quantization is not None or a.tp > 1:
        a.say(f"{lead}: only an unquantized model on one rank is sized by position (its kernels would differ); "
              "they stay uncosted.")
        return None
    dt = a.default_dtype
    got = _sized(seq, cfg, step.tokens, dt)
    if isinstance(got, str):
        a.say(f"{lead}: the sequence does not follow its layer pattern ({got}); its kernels stay uncosted.")
        return None
    part = got[a.position]
    if part is None:
        return None
    T = step.tokens
    note = (f"{SIZED}: {part.what} of {cfg.name} at {T} token(s) from the step annotation {step.name} "
            f"(a graph captured for more rows would pad them)")
    return a.op(part.cost, dt, f"{part.sig} ({SIZED})", note, dict(part.detail, what=part.what), part.category)


# one rule per kernel-name family it sizes, each in that family's category (its others: what it costs into);
# above kernel_names' category-only rules, below every rule that costs a kernel by its own name
for _family_name, _categories in (("gemm", ("gemm",)), ("norm", ("norm",)), ("rope", ("rope",)),
                                  ("activation", ("activation",)), ("kv_write", ("kv_write",)),
                                  ("copy", ("copy", "gather", "kv_write"))):
    rule(kernels=KERNEL_NAMES[_family_name], category=_categories, tensor_cores=_family_name == "gemm",
         priority=1)(by_position)
