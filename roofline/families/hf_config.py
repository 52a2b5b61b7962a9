"""A Hugging Face config.json -> the fields of one ``roofline.models.ModelConfig``, through its family.

What every config shares is read here (the sizes, checked by ``roofline.config_fields.check_sizes``; RoPE;
the notes on a missing model_type and on quantized weights); what is particular to a ``model_type`` is
its registered ``Family`` (``roofline.families.registry``): an unknown type is refused with the supported
list, and so are the mixtures of experts and hybrids not modelled (``registry.UNMODELLED``). An exact alias
(``kimi_k2``) reads as its family, with a note; a multimodal wrapper (``gemma3``, ``qwen3_vl``, ``mistral3``)
is read as its ``text_config`` (transformers' defaults for what it leaves out) with the wrapper's quantization.
Every key is checked against the family's ``Keys`` (``reader.check_keys``) before it is read.
"""

from __future__ import annotations

from pathlib import Path

from ..config_fields import check_sizes, int_field, read_json_file, show_value
from ..precision import MODELOPT_FILE, read_quantization
from ..errors import RooflineError
from .reader import IRRELEVANT, SHARED, HFReader, Keys, check_keys, rope_with_yarn
from .registry import LACKING, Refused, alias, family, families, refused, wrapper

REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")

# ModelConfig's size fields as a config.json spells them, and what their absence means.
HF_NAMES = {"hidden": "hidden_size", "intermediate": "intermediate_size", "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "vocab": "vocab_size",
            "max_context": "max_position_embeddings", "head_dim": "head_dim", "rope_theta": "rope_theta",
            "rms_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}
HF_HINTS = {"n_kv_heads": " (absent means num_attention_heads)",
            "head_dim": " (absent means hidden_size / num_attention_heads)"}


WRAPPER_KEYS = ("text_config", "vision_config", "quantization_config", "tie_word_embeddings")   # and "vision"


def _text_model(d: dict, where: str, allow_unknown: bool):
    """A multimodal wrapper's text model: (its text_config, with the wrapper's quantization_config and tying, and
    the note saying so), or (``d``, None) for a text model's own config."""
    if not isinstance(d.get("text_config"), dict) or "hidden_size" in d:
        return d, None
    outer = d.get("model_type")
    found = wrapper(outer)
    if found is None:
        if isinstance(outer, str) and outer in LACKING:
            family(outer, where)                          # refused, naming the feature it lacks
        known = ", ".join(w for f in families() for w in f.wrappers)
        raise RooflineError(f"{where} is a multimodal config ({show_value(outer)}) whose text model is not read "
                            f"(wrappers read: {known}): give its text model's config (the text_config object "
                            "saved as its own config.json).")
    fam, spec = found
    known = set(WRAPPER_KEYS) | set(spec["vision"]) | set(IRRELEVANT)
    unknown = [k for k in d if k not in known]
    if unknown and not allow_unknown:
        raise RooflineError(f"{where}: {outer}: {unknown[0]} = {show_value(d[unknown[0]])} is not a field roofline "
                            f"knows for the {outer} wrapper, and it may change the cost, so the model is refused: "
                            "remove it if the model does not use it, or pass --allow-unknown-fields to go on without "
                            "it (the model's notes then list it).")
    text = dict(d["text_config"])
    text.setdefault("model_type", fam.model_type)
    for k in ("_name_or_path", "quantization_config"):
        if d.get(k) is not None:
            text[k] = d[k]
    note = (f"{outer} ({spec['what']}): its text_config is read, with transformers' defaults for what it leaves "
            "out; the vision tower is not costed: text prefill and decode are.")
    tie = d.get("tie_word_embeddings", text.get("tie_word_embeddings", spec["tie_word_embeddings"]))
    if "tie_word_embeddings" in text and text["tie_word_embeddings"] != tie:
        note += (f" Its tie_word_embeddings ({show_value(tie)}) is the wrapper's, as transformers ties it, not the "
                 f"text_config's ({show_value(text['tie_word_embeddings'])}).")
    text["tie_word_embeddings"] = tie
    if unknown:
        note += f" --allow-unknown-fields: the wrapper's {', '.join(unknown)} ignored."
    return text, note


def _model_type(d: dict, where: str):
    """The config's model_type and its family (a bare config without one reads as a Llama, with a note; an alias
    as its family, with a note)."""
    mtype = d.get("model_type")
    note = None
    if mtype is None:
        mtype = "llama"   # a bare Llama-style config (older tools write none): read as a Llama, and say so
        note = "config.json has no model_type: read as a Llama (model_type 'llama')."
    fam = family(mtype, where)
    same = alias(mtype)
    if same is not None:
        note = f"model_type {mtype!r} reads as {fam.model_type} ({same[1]})."
        mtype = fam.model_type
    return mtype, fam, note


def _refuse_features(d: dict, entry: Refused, where: str, allow_unknown: bool):
    """A family refused feature by feature (``registry.Refused``): its keys checked as a family's are (an unknown
    one refused first), then the first feature the config turns on refused in its own line, naming the others."""
    keys = Keys(dict(SHARED)) + entry.keys
    d = keys.filled(d)
    check_keys(d, keys, where, entry.model_type, allow_unknown)
    int_field(where, "num_hidden_layers", d.get("num_hidden_layers"))
    lines = entry.refusals(d)
    if not lines:
        family(entry.model_type, where)       # none on: refused as the type, naming every feature
    names = [f.name for f in entry.features if f.on(d)]
    more = f" Also not modelled: {', '.join(names[1:])}." if len(names) > 1 else ""
    raise RooflineError(f"{where}: {entry.model_type}: {lines[0]}; costs and logits would be wrong, so the model is "
                        f"refused.{more}")


def read_hf_config(d: dict, p: Path, allow_unknown_fields: bool = False) -> dict:
    """The ``ModelConfig`` fields (keyword arguments) of a parsed Hugging Face config.json ``d`` read from ``p``;
    ``allow_unknown_fields``: a key its family does not know goes on ignored (said in the notes), not refused."""
    where = f"model config {p}"
    if not isinstance(d, dict):
        raise RooflineError(f"{where} must hold a JSON object (a Hugging Face config.json), "
                            f"but it holds {show_value(d)}.")
    top = d
    d, wrapped = _text_model(d, where, allow_unknown_fields)
    if refused(d.get("model_type")) is not None:
        _refuse_features(d, refused(d["model_type"]), where, allow_unknown_fields)
    mtype, fam, note = _model_type(d, where)
    if fam.normalize is not None:
        d = fam.normalize(d, where)
    keys = Keys(dict(SHARED)) + fam.keys
    # a bare config must give the sizes, but one its family has no use for (Qwen3.5-MoE's intermediate_size)
    d = keys.filled(d, keep_absent=() if wrapped else tuple(k for k in REQUIRED if k not in fam.keys.irrelevant))
    missing = [k for k in REQUIRED if k not in d]
    if missing:
        raise RooflineError(f"{where} is missing the key {missing[0]!r} "
                            "(a config.json needs hidden_size, intermediate_size, "
                            "num_hidden_layers, num_attention_heads and vocab_size).")
    r = HFReader(d, where, mtype)
    r.notes += [n for n in (wrapped, note) if n]
    r.notes += check_keys(d, keys, where, mtype, allow_unknown_fields)
    modelopt = p.parent / MODELOPT_FILE
    quant = read_quantization(d, read_json_file(modelopt, "ModelOpt config") if modelopt.is_file() else None)
    if quant is not None and not fam.says_quantization:
        r.notes.append(f"{quant.source} ({quant.method}): the published weights are quantized; costs read each "
                       "module's format from it (--weight-dtype overrides); real weights run as stored where the "
                       "backend's kernels take the format, else dequantized at load (the model's notes say which).")
    head_dim = d.get("head_dim")
    defaults = {"tie_word_embeddings": False, "rms_norm_eps": 1e-5}   # a family whose Keys leave them out
    raw = {
        "hidden": d["hidden_size"], "intermediate": d["intermediate_size"], "n_layers": d["num_hidden_layers"],
        "n_heads": d["num_attention_heads"], "n_kv_heads": r.get("num_key_value_heads", d["num_attention_heads"]),
        "vocab": d["vocab_size"], "max_context": r.get("max_position_embeddings", 4096),
        "head_dim": 0 if head_dim is None else int_field(where, "head_dim", head_dim, 1, HF_HINTS["head_dim"]),
        "rope_theta": 10000.0, "rms_eps": r.get("rms_norm_eps", defaults["rms_norm_eps"]),
        "tie_embeddings": r.get("tie_word_embeddings", defaults["tie_word_embeddings"]),
    }
    if fam.head_dim is not None:
        raw["head_dim"] = fam.head_dim(r)
    values = check_sizes(raw, where, HF_NAMES, HF_HINTS)  # sizes first, so their errors come first
    int_field(where, "num_hidden_layers", d["num_hidden_layers"])
    fam.read(r)
    values.update((k, r.arch.pop(k)) for k in tuple(r.arch) if k in values)   # a size the family reads (Llama-4's)
    values["rope_theta"] = (fam.rope or rope_with_yarn)(r)
    # named by _name_or_path, else by its folder (a config.json) or its own name (gemma-3-4b-it.json)
    name = top.get("_name_or_path") or (p.parent.name if p.name == "config.json" else p.stem) or mtype or "custom"
    weights = any(p.parent.glob("*.safetensors")) or any(p.parent.glob("*.safetensors.index.json"))  # or an index alone
    ckpt = str(p.parent.resolve()) if weights else ""
    return dict(name=str(name), **values, **r.arch, checkpoint=ckpt, notes=tuple(r.notes), quantization=quant)
