"""The checkpoint's own precision: a config.json's ``quantization_config`` (or ModelOpt's ``hf_quant_config.json``
beside it) read into a ``Quantization``, then matched against each op's Hugging Face module names into a
``Precision`` (``resolve``).

Read (``READERS``, one entry per ``quant_method``):
- ``fp8`` (transformers' fine-grained FP8, DeepSeek-V3, Qwen3-FP8): e4m3 weights in 128 x 128 blocks with an
  fp32 ``weight_scale_inv`` each (``weight_block_size``), dynamic 1 x 128 activation groups
  (``activation_scheme`` dynamic); every Linear but ``modules_to_not_convert`` and lm_head;
- ``compressed-tensors`` (llm-compressor): each of ``config_groups`` gives its ``targets`` (class names, "Linear",
  or "re:" regexes) a weight scheme (``num_bits``, ``type``, ``strategy`` tensor / channel / group / block,
  ``group_size``, ``symmetric``) and optionally ``input_activations``; ``ignore`` leaves modules out;
  ``kv_cache_scheme`` an fp8 cache with per-tensor scales; ``format`` must be one whose storage is modelled;
- ``mxfp4`` (gpt-oss): the experts in MX blocks of 32 (``*_blocks``, ``*_scales``), but ``modules_to_not_convert``;
- ``gptq`` / ``awq``: int4 ``qweight`` with fp16 ``scales`` per ``group_size`` and packed ``qzeros`` (GPTQ's
  ``g_idx`` too), every Linear of the layers (lm_head not);
- ModelOpt (``hf_quant_config.json``'s ``quantization``, or ``quant_method`` modelopt): ``quant_algo`` FP8
  (per-tensor weight and static input scales) or NVFP4 (blocks of 16, e4m3 scales, an fp32 tensor scale),
  ``kv_cache_quant_algo`` FP8, ``exclude_modules``.
Any other method, a field of these that changes bytes and is not modelled, or an op whose layers would be stored
differently, is refused in one line naming it. What a rule leaves out (an ignore list, a module a method does not
touch) stays in the checkpoint's float dtype, costed as the activation dtype.

Names are matched as the checkpoint's loaders match them: a "re:" pattern with ``re.match`` on the module's
full name (``model.layers.3.self_attn.q_proj``); any other pattern as the name itself, a glob (``fnmatch``), a
prefix of modules (``model.layers.*.self_attn``) or a trailing component (``lm_head``); "Linear" every linear
projection (the per-expert ones of families that keep experts as Linears; an MoE gate is not counted one: the
published checkpoints keep their gates in bf16). A module answers to its text model's name and to the names of
the text part of a multimodal wrapper (``TEXT_PREFIXES``: transformers 5's ``model.language_model.layers.3...``,
4.x's ``language_model.model.layers.3...``, and ``language_model.lm_head``), so a wrapper's targets and ignore list
written against those apply; its vision tower's entries name no module of ours and change nothing.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from fnmatch import fnmatch

from ..errors import RooflineError
from .formats import act_format, kv_format, lookup, weight_format
from .modules import MODULES, WEIGHT_ROLES, Precision, module_pairs

EXPERTS_ONLY = "@experts"   # a target meaning the routed-experts class (mxfp4 converts the experts only)
# Where a checkpoint keeps the decoder: a causal LM's "model.", or a multimodal wrapper's text model (transformers 5,
# then 4.x); a name outside "model." (lm_head) is "language_model." + it in the 4.x wrappers.
TEXT_PREFIXES = ("model.", "model.language_model.", "language_model.model.")


@dataclass(frozen=True)
class Rule:
    """Targets (patterns) and the formats they are stored (``weight``) and run (``act``: None, weight-only) in."""

    targets: tuple
    weight: object
    act: object = None


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's scheme as read: its ``method``, where it came from (``source``), the rules in order (the
    first that matches a module sets it), the ``ignore`` patterns, the KV cache's format and the raw JSON
    (``raw``: for a result file's header, read back by ``from_dict``)."""

    method: str
    source: str
    rules: tuple
    ignore: tuple = ()
    kv: object = None
    raw: str = "{}"

    def to_dict(self) -> dict:
        return {"source": self.source, "config": json.loads(self.raw)}

    @classmethod
    def from_dict(cls, d) -> "Quantization | None":
        if d is None or isinstance(d, Quantization):
            return d
        if not isinstance(d, dict) or not isinstance(d.get("config"), dict):
            raise RooflineError(f"model description: quantization must be {{'source', 'config'}}, not {d!r}.")
        return read_scheme(d["config"], d.get("source", "quantization_config"))


def _refuse(source: str, what: str, why: str = "is not modelled") -> None:
    raise RooflineError(f"{source}: {what} {why}.")


def _fields(q: dict, source: str, allowed: tuple) -> None:
    """Refuse a field that is not one of ``allowed`` (each modelled, or known not to change bytes)."""
    for k in q:
        if k not in allowed:
            _refuse(source, f"field {k!r}", f"is not modelled (read: {', '.join(allowed)})")


# ------------------------------------------------------------------------------------------------ the methods
def _fp8(q: dict, source: str) -> Quantization:
    _fields(q, source, ("quant_method", "fmt", "activation_scheme", "weight_block_size", "modules_to_not_convert",
                        "scale_fmt"))
    if q.get("fmt", "e4m3") not in ("e4m3", "float8_e4m3fn"):      # MiniMax-M2 writes torch's name of e4m3
        _refuse(source, f"fmt {q['fmt']!r}", "is not modelled (e4m3 only: e4m3 or float8_e4m3fn)")
    # DeepSeek-V3.2's "ue8m0": every block scale a power of two (its inference rounds the activations' scales up
    # to one), still stored as an fp32 weight_scale_inv per 128 x 128 block: the same bytes, other numerics
    if q.get("scale_fmt") not in (None, "ue8m0"):
        _refuse(source, f"scale_fmt {q['scale_fmt']!r}", "is not modelled (null, or ue8m0: power-of-two scales "
                                                          "stored in fp32)")
    block = q.get("weight_block_size", [128, 128])
    if list(block or []) != [128, 128]:
        _refuse(source, f"weight_block_size {block!r}", "is not modelled (128 x 128 blocks only)")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        _refuse(source, f"activation_scheme {scheme!r}", "is not modelled (dynamic 1 x 128 groups only)")
    return Quantization("fp8", source, (Rule(("Linear",), lookup("fp8-block", "weight"), act_format("fp8-group")),),
                        tuple(q.get("modules_to_not_convert") or ()) + ("lm_head",))


def _mxfp4(q: dict, source: str) -> Quantization:
    _fields(q, source, ("quant_method", "modules_to_not_convert"))
    return Quantization("mxfp4", source, (Rule((EXPERTS_ONLY,), lookup("mxfp4", "weight")),),
                        tuple(q.get("modules_to_not_convert") or ()))


def _int4_group(q: dict, source: str, name: str, zero: bool) -> object:
    if q.get("bits", 4) != 4:
        _refuse(source, f"bits {q.get('bits')!r}", "is not modelled (4-bit only)")
    g = q.get("group_size", 128)
    f = weight_format("int4", g)          # the group sizes the registry runs, refused in one line otherwise
    base = lookup(name, "weight")
    return replace(base, scales=replace(base.scales, k=g, zero=base.scales.zero if zero else ""), group_size=g,
                   zero_point=zero, label=base.label.replace("g128", f"g{f.group_size}")
                   + ("" if zero else ", no zero points"))


def _gptq(q: dict, source: str) -> Quantization:
    _fields(q, source, ("quant_method", "bits", "group_size", "desc_act", "sym", "damp_percent", "true_sequential",
                        "static_groups", "checkpoint_format", "model_name_or_path", "model_file_base_name",
                        "modules_to_not_convert", "dataset", "tokenizer", "use_exllama", "meta", "pack_dtype",
                        "lm_head", "format", "quant_method_version", "batch_size", "block_name_to_quantize",
                        "cache_block_outputs", "exllama_config", "max_input_length", "model_seqlen",
                        "module_name_preceding_first_block", "modules_in_block_to_quantize", "pad_token_id",
                        "use_cuda_fp16"))
    for k in ("modules_in_block_to_quantize", "block_name_to_quantize"):
        if q.get(k):
            _refuse(source, f"{k} {q[k]!r}", "is not modelled (every Linear of the layers)")
    if q.get("checkpoint_format", q.get("format", "gptq")) not in ("gptq", "gptq_v2"):
        _refuse(source, f"checkpoint_format {q.get('checkpoint_format', q.get('format'))!r}",
                "is not modelled (gptq's qweight / qzeros / scales / g_idx only)")
    if q.get("lm_head"):
        _refuse(source, "lm_head true (a quantized lm_head)")
    # GPTQ stores qzeros and g_idx whether or not sym / desc_act: neither changes the bytes.
    return Quantization("gptq", source, (Rule(("Linear",), _int4_group(q, source, "gptq-int4", True)),),
                        tuple(q.get("modules_to_not_convert") or ()) + ("lm_head",))


def _awq(q: dict, source: str) -> Quantization:
    _fields(q, source, ("quant_method", "bits", "group_size", "zero_point", "version", "modules_to_not_convert",
                        "backend"))
    if str(q.get("version", "gemm")).lower() != "gemm":
        _refuse(source, f"version {q.get('version')!r}", "is not modelled (AWQ's gemm layout only)")
    return Quantization("awq", source, (Rule(("Linear",), _int4_group(q, source, "awq-int4",
                                                                      bool(q.get("zero_point", True)))),),
                        tuple(q.get("modules_to_not_convert") or ()) + ("lm_head",))


_CT_FORMATS = ("float-quantized", "naive-quantized", "int-quantized", "pack-quantized", "nvfp4-pack-quantized")


def _ct_weight(w: dict, where: str):
    """A compressed-tensors weight scheme -> a registered format, or one line naming what is not modelled."""
    bits, typ, strat = w.get("num_bits"), w.get("type", "int"), w.get("strategy", "tensor")
    if w.get("actorder"):
        _refuse(where, f"actorder {w['actorder']!r}", "is not modelled (a g_idx per input row)")
    if typ == "float" and bits == 8:
        if strat == "block":
            if list(w.get("block_structure") or []) != [128, 128]:
                _refuse(where, f"block_structure {w.get('block_structure')!r}", "is not modelled (128 x 128 only)")
            return lookup("fp8-block", "weight")
        if strat in ("tensor", "channel"):
            return lookup("fp8-tensor" if strat == "tensor" else "fp8", "weight")
    if typ == "float" and bits == 4 and strat in ("tensor_group", "group") and w.get("group_size") == 16:
        return lookup("nvfp4", "weight")
    if typ == "int" and bits == 8 and strat == "channel" and w.get("symmetric", True):
        return lookup("int8", "weight")
    if typ == "int" and bits == 4 and strat == "group":
        return weight_format("int4", w.get("group_size"), not w.get("symmetric", True))
    _refuse(where, f"weights {typ} {bits}-bit {strat}" + (f" g{w['group_size']}" if w.get("group_size") else ""))


def _ct_act(a, where: str):
    if not a:
        return None
    bits, typ, strat, dyn = a.get("num_bits"), a.get("type", "int"), a.get("strategy", "tensor"), a.get("dynamic")
    if typ == "float" and bits == 8:
        if strat == "tensor" and not dyn:
            return act_format("fp8-tensor")
        if strat == "token" and dyn:
            return act_format("fp8")
        if strat == "group" and dyn and a.get("group_size") == 128:
            return act_format("fp8-group")
    if typ == "float" and bits == 4 and strat in ("tensor_group", "group"):
        return act_format("nvfp4")
    _refuse(where, f"input activations {typ} {bits}-bit {strat}{' dynamic' if dyn else ' static'}")


def _ct_kv(s, source: str):
    if not s:
        return None
    if s.get("type") == "float" and s.get("num_bits") == 8 and s.get("strategy", "tensor") == "tensor":
        return kv_format("fp8-tensor")
    _refuse(source, f"kv_cache_scheme {s!r}", "is not modelled (fp8 with per-tensor scales only)")


def _compressed(q: dict, source: str) -> Quantization:
    _fields(q, source, ("quant_method", "config_groups", "ignore", "format", "kv_cache_scheme", "quantization_status",
                        "global_compression_ratio", "sparsity_config", "version", "transform_config"))
    if q.get("format", "float-quantized") not in _CT_FORMATS:
        _refuse(source, f"format {q.get('format')!r}", f"is not modelled (read: {', '.join(_CT_FORMATS)})")
    sp = q.get("sparsity_config")
    if sp and sp.get("format", "dense") != "dense":
        _refuse(source, f"sparsity_config format {sp.get('format')!r}")
    if q.get("transform_config"):
        _refuse(source, "transform_config (rotations)")
    rules = []
    for name, g in (q.get("config_groups") or {}).items():
        where = f"{source} config_groups.{name}"
        if g.get("output_activations"):
            _refuse(where, "output_activations")
        rules.append(Rule(tuple(g.get("targets") or ()), _ct_weight(g.get("weights") or {}, where),
                          _ct_act(g.get("input_activations"), where)))
    if not rules:
        _refuse(source, "a compressed-tensors config without config_groups", "quantizes nothing")
    return Quantization("compressed-tensors", source, tuple(rules), tuple(q.get("ignore") or ()),
                        _ct_kv(q.get("kv_cache_scheme"), source))


def _modelopt(q: dict, source: str) -> Quantization:
    """ModelOpt: ``hf_quant_config.json``'s "quantization" object (or a config.json's modelopt quantization_config)."""
    body = q.get("quantization", q)
    _fields(body, source, ("quant_method", "quant_algo", "kv_cache_quant_algo", "exclude_modules", "group_size",
                           "producer", "quantization"))
    algo = str(body.get("quant_algo") or "").upper()
    if algo == "FP8":
        rule = Rule(("Linear",), lookup("fp8-tensor", "weight"), act_format("fp8-tensor"))
    elif algo == "NVFP4":
        if body.get("group_size", 16) != 16:
            _refuse(source, f"NVFP4 group_size {body['group_size']!r}", "is not modelled (16 only)")
        rule = Rule(("Linear",), lookup("nvfp4", "weight"), act_format("nvfp4"))
    else:
        _refuse(source, f"quant_algo {body.get('quant_algo')!r}", "is not modelled (FP8 and NVFP4 only)")
    kv = body.get("kv_cache_quant_algo")
    if kv not in (None, "FP8", "fp8"):
        _refuse(source, f"kv_cache_quant_algo {kv!r}", "is not modelled (FP8 only)")
    return Quantization("modelopt", source, (rule,), tuple(body.get("exclude_modules") or ()),
                        kv_format("fp8-tensor") if kv else None)


READERS = {"fp8": _fp8, "compressed-tensors": _compressed, "mxfp4": _mxfp4, "gptq": _gptq, "awq": _awq,
           "modelopt": _modelopt}
MODELOPT_FILE = "hf_quant_config.json"


def read_scheme(q, source: str = "quantization_config") -> Quantization:
    """One parsed scheme (a config.json's ``quantization_config``, or ModelOpt's ``hf_quant_config.json``)."""
    if not isinstance(q, dict):
        _refuse(source, f"{q!r}", "must be a JSON object")
    method = "modelopt" if source == MODELOPT_FILE else q.get("quant_method")
    if method not in READERS:
        _refuse(source, f"quant_method {method!r}", f"is not modelled (read: {', '.join(READERS)})")
    got = READERS[method](q, source)
    return replace(got, raw=json.dumps(q, sort_keys=True))


def read_quantization(d: dict, modelopt: dict | None = None) -> Quantization | None:
    """The scheme of a config.json ``d`` (its ``quantization_config``), else of ModelOpt's ``hf_quant_config.json``
    beside it (``modelopt``, parsed); None for an unquantized checkpoint."""
    q = d.get("quantization_config")
    if q is not None:
        return read_scheme(q)
    if modelopt is not None:
        return read_scheme(modelopt, MODELOPT_FILE)
    return None


# ------------------------------------------------------------------------------------------------ matching
def _matches(pattern: str, name: str, linear: bool, module: str) -> bool:
    if pattern == "Linear":
        return linear
    if pattern == EXPERTS_ONLY:
        return module == "experts"
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return any(fnmatch(name, p) for p in (pattern, pattern + ".*", "*." + pattern, "*." + pattern + ".*"))


def _module_name(w, layer) -> str:
    n = w.hf.replace("{e}", "0").removesuffix(".weight")
    return n if layer is None else f"model.layers.{layer}.{n}"


def _wrapped_names(name: str) -> tuple:
    """A module's text-model name and its names as the text part of a multimodal wrapper (``TEXT_PREFIXES``)."""
    if name.startswith(TEXT_PREFIXES[0]):
        rest = name.removeprefix(TEXT_PREFIXES[0])
        return tuple(p + rest for p in TEXT_PREFIXES)
    return (name, "language_model." + name)


def _is_linear(w, module: str) -> bool:
    """Whether the loaders see this tensor as an nn.Linear: a projection (not a router gate nor the embedding),
    or one expert's projection where the family keeps experts as Linears (its name has the expert index)."""
    if w.role == "experts":
        return "{e}" in w.hf
    return w.role == "linear" and module not in ("router", "embedding")


def _stored(q: Quantization, w, layer, module: str) -> tuple:
    """(weight format, act format) of one tensor: the first rule that targets it, unless it is ignored."""
    name = _module_name(w, layer)
    linear = _is_linear(w, module)
    if any(_matches(p, n, False, module) for p in q.ignore for n in _wrapped_names(name)):
        return (None, None)
    for r in q.rules:
        if any(_matches(p, n, linear, module) for p in r.targets for n in _wrapped_names(name)):
            return (r.weight, r.act)
    return (None, None)


def _op_stored(q: Quantization, o) -> tuple:
    """One op's (weight, act) formats, the same in every layer it runs in and for every tensor it reads."""
    seen = {}
    for layer in (o.layers if o.per_layer else (None,)):
        for w in o.weights:
            if w.role in WEIGHT_ROLES:
                seen.setdefault(_stored(q, w, layer, o.module), _module_name(w, layer))
    if len(seen) > 1:
        (a, na), (b, nb) = list(seen.items())[:2]
        show = lambda f: f[0].name if f[0] else "unquantized"  # noqa: E731
        raise RooflineError(f"{q.source}: op {o.name!r} would be stored as {show(a)} ({na}) and {show(b)} ({nb}): "
                            "a different precision across the layers or tensors of one op is not modelled.")
    return next(iter(seen), (None, None))


def resolve(q: Quantization | None, ops) -> Precision:
    """The ``Precision`` of a model whose ops (``roofline.layer.model_ops``) are stored as ``q`` says: each
    module class at the format most of its ops are stored in, the others its exceptions."""
    if q is None:
        return Precision()
    got = {}
    for o in ops:
        if o.module in MODULES and any(w.role in WEIGHT_ROLES for w in o.weights):
            got[o.name] = (o.module, _op_stored(q, o))
    if any(m == "embedding" and f[0] is not None and f[0].quantized for m, f in got.values()):
        _refuse(q.source, "a quantized embedding table")
    weights, acts, ops_ = {}, {}, []
    for m in MODULES:
        mine = [(n, f) for n, (mm, f) in got.items() if mm == m]
        if not mine:
            continue
        major = Counter(f for _, f in mine).most_common(1)[0][0]
        if major[0] is not None:
            weights[m] = major[0]
        if major[1] is not None:
            acts[m] = major[1]
        ops_ += [(n, m, f[0]) for n, f in mine if f != major]
    return Precision(module_pairs(weights), module_pairs(acts), tuple(ops_), q.kv, q.source)
