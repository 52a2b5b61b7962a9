"""What every family's config.json reader uses: ``HFReader`` (a config read field by field, refusing in one
line what is not modelled) and the RoPE readings (``rope_theta``: the base, scaling kept as a note;
``yarn``: YaRN's parameters, which are modelled).

Refuse, never guess: a field that changes cost or numerics is read into ``ModelConfig`` or refused in one
line naming it ("gemma2: attn_logit_softcapping ..."); a field that changes only numerics, not cost (RoPE
scaling), is a note said once.

Strict fields (``Keys``, ``check_keys``): every family lists every config key it knows, beside its reader, as
modelled (with transformers' default, filled in where the config leaves the key out), numerics-only (a note
when set otherwise than transformers' default), refused (a feature that is not modelled, unless left off) or
irrelevant to cost (ids, versions, dtypes, token ids, training-only settings: ``IRRELEVANT`` for every
family). Any other key is refused in one line naming it; ``allow_unknown`` goes on with a note listing them.
The keys inside ``rope_parameters`` / ``rope_scaling`` are classified per RoPE type the same way (``ROPE_KEYS``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..config_fields import MAX_SIZES, bool_field, bounded, float_field, int_field, show_value
from ..errors import RooflineError


# Keys of every config that do not change a step's cost: PretrainedConfig's own (ids, versions, dtypes, output
# switches), token ids, generation settings older transformers wrote into every config, and training-only
# settings (dropout, initialisation, router losses, caches switched on for generation).
IRRELEVANT = (
    "_name_or_path", "architectures", "auto_map", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label",
    "label2id", "is_encoder_decoder", "model_type", "output_attentions", "output_hidden_states", "problem_type",
    "return_dict", "transformers_version", "use_cache", "initializer_range", "pad_token_id", "bos_token_id",
    "eos_token_id", "sep_token_id", "decoder_start_token_id", "tokenizer_class", "attention_dropout",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "use_bfloat16", "torchscript",
    "tie_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size", "pruned_heads",
    "finetuning_task", "task_specific_params", "prefix", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "tf_legacy_loss", "_attn_implementation_autoset", "use_return_dict", "cache_implementation",
)

# What hf_config.read_hf_config itself reads from every config (the sizes, RoPE, tying, the norms' epsilon and
# the quantization), with transformers' defaults where they are common to the families (a family overrides them).
SHARED = {"hidden_size": None, "intermediate_size": None, "num_hidden_layers": None, "num_attention_heads": None,
          "num_key_value_heads": None, "vocab_size": None, "max_position_embeddings": None, "head_dim": None,
          "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
          "rope_parameters": None, "quantization_config": None}


# The keys inside rope_parameters / rope_scaling (transformers 5.24's modeling_rope_utils: each RoPE type's required
# and optional keys) per RoPE type: (modelled, numerics-only). Modelled: the base (rope_theta) and YaRN's parameters
# (``yarn``); numerics-only: a rescaling of the rotation angles that changes no cost (said once as a note, by
# ``rope_theta``). partial_rotary_factor is the family's to read (``rotary_dim``) or refuse, where it knows the key
# at the top level (transformers 5 moves it in here); "type" is the 4.x spelling of rope_type. A family's own
# (``Keys.rope``: Qwen3-VL's mrope_section) adds to them. Any other key, or RoPE type, is refused, naming it.
ROPE_COMMON = ("rope_type", "type", "rope_theta")
ROPE_KEYS = {
    "default": ((), ()),
    "yarn": (("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
              "mscale_all_dim", "truncate"), ()),
    "linear": ((), ("factor",)),
    "dynamic": ((), ("factor",)),
    "longrope": ((), ("short_factor", "long_factor", "original_max_position_embeddings", "attention_factor",
                      "factor")),
    "llama3": ((), ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")),
}


@dataclass(frozen=True)
class Keys:
    """The config keys one family knows (transformers' defaults from its config class: the family file names
    the version). ``modelled``: key -> default (None: none, or derived from other keys), filled in where the
    config leaves the key out; ``numerics``: key -> (default, what it changes), said as a note when set otherwise;
    ``refused``: key -> (the feature it turns on, the values that leave it off); ``irrelevant``: keys that change
    no cost, beyond ``IRRELEVANT``; ``rope``: keys inside rope_parameters its model reads beyond its RoPE type's
    (``ROPE_KEYS``). Combined with ``+`` (the right side's entries win)."""

    modelled: dict = field(default_factory=dict)
    numerics: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)
    irrelevant: tuple = ()
    rope: tuple = ()

    def __add__(self, other: "Keys") -> "Keys":
        return Keys({**self.modelled, **other.modelled}, {**self.numerics, **other.numerics},
                    {**self.refused, **other.refused}, tuple(dict.fromkeys(self.irrelevant + other.irrelevant)),
                    tuple(dict.fromkeys(self.rope + other.rope)))

    def known(self) -> set:
        return set(self.modelled) | set(self.numerics) | set(self.refused) | set(self.irrelevant) | set(IRRELEVANT)

    def filled(self, d: dict, keep_absent=()) -> dict:
        """``d`` with transformers' default for every modelled key it leaves out (but ``keep_absent``); the RoPE
        base only where neither rope_theta nor rope_parameters is given."""
        out = dict(d)
        for k, v in self.modelled.items():
            if k in out or v is None or k in keep_absent:
                continue
            if k == "rope_theta" and "rope_parameters" in d:
                continue
            if k == "rope_parameters" and {"rope_theta", "rope_scaling"} & set(d):
                continue
            out[k] = v
        return out


def check_keys(d: dict, keys: Keys, where: str, mtype: str, allow_unknown: bool = False) -> list:
    """Refuse (one line) a known feature that is not modelled, then any key ``keys`` does not know (unless
    ``allow_unknown``); the notes: numerics-only keys set otherwise than transformers' default, keys let through."""
    for k, (feature, off) in keys.refused.items():
        if k in d and d[k] not in off:
            raise RooflineError(f"{where}: {mtype}: {k} = {show_value(d[k])} turns on {feature}, which is not "
                                f"modelled (only {' or '.join(json.dumps(v) for v in off)} is); costs and logits "
                                "would be wrong, so the model is refused.")
    known = keys.known()
    unknown = [k for k in d if k not in known]
    if unknown and not allow_unknown:
        more = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:4])}{' ...' if len(unknown) > 4 else ''})" \
            if len(unknown) > 1 else ""
        raise RooflineError(f"{where}: {mtype}: {unknown[0]} = {show_value(d[unknown[0]])}{more} is not a field "
                            f"roofline knows for {mtype}, and it may change the cost, so the model is refused: "
                            "remove it if the model does not use it, or pass --allow-unknown-fields to go on "
                            "without it (the model's notes then list it).")
    nested = rope_unknown(d, keys)
    if nested and not allow_unknown:
        name, value, kind, allowed = nested[0]
        what = (f"a RoPE type roofline knows (known: {', '.join(ROPE_KEYS)})" if allowed is None else
                f"a key roofline knows in a {kind} RoPE for {mtype} (known: {', '.join(allowed)})")
        raise RooflineError(f"{where}: {mtype}: {name} = {show_value(value)} is not {what}, and it may change the "
                            "cost, so the model is refused: remove it if the model does not use it, or pass "
                            "--allow-unknown-fields to go on without it (the model's notes then list it).")
    unknown += [name for name, *_ in nested]
    notes = []
    for k, (default, what) in keys.numerics.items():
        if d.get(k, default) != default:
            notes.append(f"{k} = {show_value(d[k])} {what}; costs are unaffected, logits differ from the real model.")
    if unknown:
        notes.append(f"--allow-unknown-fields: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not "
                     f"known for {mtype} and ignored; costs and logits assume {'it changes' if len(unknown) == 1 else 'they change'} "
                     "nothing.")
    return notes


def _rope_objects(d: dict):
    """(where, object) of every RoPE object in ``d``: rope_parameters and rope_scaling, or each layer type's in a
    rope_parameters keyed by layer type (Gemma-3 in transformers 5)."""
    for key in ("rope_parameters", "rope_scaling"):
        spec = d.get(key)
        if not isinstance(spec, dict):
            continue
        if spec and all(isinstance(v, dict) for v in spec.values()):
            yield from ((f"{key}.{t}", v) for t, v in spec.items())
        else:
            yield key, spec


def rope_unknown(d: dict, keys: Keys) -> list:
    """(name, value, RoPE type, the keys known for it; None: the type itself is unknown) of every key inside the RoPE
    objects of ``d`` that ``ROPE_KEYS`` (and the family's ``keys.rope``) do not know for its RoPE type."""
    out = []
    extra = keys.rope + (("partial_rotary_factor",) if "partial_rotary_factor" in keys.known() else ())
    for where, spec in _rope_objects(d):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if not isinstance(kind, str) or kind not in ROPE_KEYS:
            out.append((f"{where}.{'rope_type' if 'rope_type' in spec else 'type'}", kind, kind, None))
            continue
        allowed = ROPE_COMMON + ROPE_KEYS[kind][0] + ROPE_KEYS[kind][1] + extra
        out += [(f"{where}.{k}", v, json.dumps(kind), allowed) for k, v in spec.items() if k not in allowed]
    return out


class HFReader:
    """What one config.json says, read field by field: ``get`` (absent and null mean the default) and
    ``refuse`` (a one-line RooflineError naming the model type and the field). A family's reader fills
    ``arch`` (ModelConfig's architecture fields) and ``notes``."""

    def __init__(self, d: dict, where: str, mtype: str):
        self.d, self.where, self.mtype = d, where, mtype
        self.arch: dict = {"arch": mtype}
        self.notes: list[str] = []

    def get(self, key, default=None):
        v = self.d.get(key)
        return default if v is None else v

    def refuse(self, key, why: str = "is not modelled"):
        raise RooflineError(f"{self.where}: {self.mtype}: {key} = {show_value(self.d.get(key))} {why}; "
                            "costs and logits would be wrong, so the model is refused.")

    def expect(self, key, allowed, default=None):
        """``key`` must be one of ``allowed`` (absent: ``default``), else refused."""
        v = self.get(key, default)
        if v not in allowed:
            self.refuse(key, f"is not modelled (supported: {', '.join(map(str, allowed))})")
        return v

    def flag(self, key, default=False) -> bool:
        return bool_field(self.where, key, self.get(key, default))

    def number(self, key) -> float:
        """A positive float, or 0.0 when absent or null."""
        v = self.d.get(key)
        return 0.0 if v is None else float_field(self.where, key, v)

    def dt_limit(self, key="time_step_limit") -> dict:
        """Mamba-2's dt clamp [min, max] (transformers' time_step_limit, default (0, inf); its config files spell an
        infinite max {"__float__": "Infinity"}) as ModelConfig's mamba_dt_min / mamba_dt_max (0: no bound)."""
        v = self.get(key, [0.0, float("inf")])
        if isinstance(v, (list, tuple)):     # transformers 5 saves inf as {"__float__": "Infinity"}
            v = [float("inf") if x == {"__float__": "Infinity"} else x for x in v]
        if (not isinstance(v, (list, tuple)) or len(v) != 2
                or any(isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x < 0 for x in v)
                or v[1] < v[0]):
            self.refuse(key, "must be [min, max] with 0 <= min <= max (dt's clamp in the Mamba-2 scan)")
        lo, hi = float(v[0]), float(v[1])
        return {"mamba_dt_min": lo, "mamba_dt_max": 0.0 if hi == float("inf") else hi}

    def count(self, key, default, minimum: int = 1) -> int:
        """An integer of at least ``minimum`` (absent or null: ``default``)."""
        return int_field(self.where, key, self.get(key, default), minimum)

    def size(self, key) -> int:
        """A positive integer the config must give (absent: refused as one)."""
        return int_field(self.where, key, self.d.get(key), 1)

    def experts(self, *keys) -> int:
        """The number of routed experts, under the first of ``keys`` the config gives."""
        for k in keys:
            if self.d.get(k) is not None:
                return bounded(self.where, k, int_field(self.where, k, self.d[k], 1, " (routed experts)"),
                               MAX_SIZES["n_experts"])
        raise RooflineError(f"{self.where}: {self.mtype}: the number of experts ({' or '.join(keys)}) is missing.")

    def activation(self, *keys, want=("silu",)):
        for k in keys:
            if self.d.get(k) is not None:
                v = self.d[k]
                if v in ("silu", "swish"):
                    return "silu"
                if v in ("gelu_pytorch_tanh", "gelu_tanh") or (v == "gelu" and "gelu_tanh" in want):
                    # Gemma-1 configs say "gelu" and run the tanh approximation (transformers forces it)
                    return "gelu_tanh"
                self.refuse(k, "is not modelled (supported: silu, gelu_pytorch_tanh)")
        return want[0]

    def window(self, use_key: str | None = None, max_window_layers: bool = False):
        """sliding_window (0 when absent, null, or switched off by ``use_key``) and per-layer types."""
        n = self.d["num_hidden_layers"]
        w = self.d.get("sliding_window")
        if use_key is not None and not self.flag(use_key):
            w = None
        if w is None:
            self._no_sliding_types()
            return 0, ()
        w = int_field(self.where, "sliding_window", w, 1, " (keys a windowed query sees)")
        types = self._layer_types(n)
        if types is None:
            if max_window_layers:   # Qwen2/3: layers from max_window_layers on slide
                first = int_field(self.where, "max_window_layers", self.get("max_window_layers", n), 0)
                types = tuple("sliding" if i >= first else "full" for i in range(n))
            else:
                types = ("sliding",) * n
        if "sliding" not in types:
            return 0, ()
        return w, (() if all(t == "sliding" for t in types) else types)

    def _layer_types(self, n: int):
        lt = self.d.get("layer_types")
        if lt is None:
            return None
        kinds = {"full_attention": "full", "sliding_attention": "sliding"}
        if not isinstance(lt, list) or any(t not in kinds for t in lt):
            self.refuse("layer_types", "is not modelled (supported: full_attention, sliding_attention per layer)")
        if len(lt) != n:
            raise RooflineError(f"{self.where}: layer_types has {len(lt)} entries for num_hidden_layers {n}: give "
                                "one per layer.")
        return tuple(kinds[t] for t in lt)

    def _no_sliding_types(self):
        types = self._layer_types(self.d["num_hidden_layers"])
        if types and "sliding" in types:
            raise RooflineError(f"{self.where}: layer_types has sliding_attention layers but sliding_window is "
                                "null or switched off: give the window.")


def rotary_dim(r: HFReader, head_dim: int, default: float = 1.0) -> int:
    """Partial rotary: partial_rotary_factor (at the top, 4.x, or in rope_parameters, 5.x; absent: ``default``) x
    ``head_dim``, the dims RoPE rotates at the start of each head (``ModelConfig.rotary_dim``: 0 when all)."""
    params = r.d.get("rope_parameters") if isinstance(r.d.get("rope_parameters"), dict) else {}
    top = r.d.get("partial_rotary_factor") is not None
    key = "partial_rotary_factor" if top else "rope_parameters.partial_rotary_factor"
    f = r.d["partial_rotary_factor"] if top else params.get("partial_rotary_factor")
    f = float_field(r.where, key, default if f is None else f, " (the share of each head's dims RoPE rotates)")
    rd = int(head_dim * f)
    if f > 1 or rd % 2 or rd == 0:
        raise RooflineError(f"{r.where}: {r.mtype}: {key} = {f:g} gives {rd} rotary dims of head_dim {head_dim}, "
                            "which is not modelled (an even number of dims, at most head_dim): fix the factor.")
    return 0 if rd == head_dim else rd


def _brief(v, limit: int = 240) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= limit else s[: limit - 4] + " ...}"


def rope_theta(d: dict, where: str, notes: list) -> float:
    """rope_theta from the top level or from ``rope_parameters`` (current transformers); scaling becomes a note."""
    params = d.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise RooflineError(f"{where}: rope_parameters must be an object such as "
                            f'{{"rope_theta": 500000.0, "rope_type": "default"}}, but {show_value(params)} was given.')
    scaling = d.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise RooflineError(f"{where}: rope_scaling must be an object such as "
                            f'{{"rope_type": "llama3", "factor": 8.0}} or null, but {show_value(scaling)} was given.')
    top = d.get("rope_theta")
    nested = (params or {}).get("rope_theta")
    theta = 10000.0
    if top is not None:
        theta = float_field(where, "rope_theta", top, " (the RoPE base, e.g. 10000)")
    if nested is not None:
        inner = float_field(where, "rope_parameters.rope_theta", nested, " (the RoPE base, e.g. 10000)")
        if top is None:
            theta = inner
        elif inner != theta:
            notes.append(f"rope_theta {theta:g} and rope_parameters.rope_theta {inner:g} disagree: "
                         f"the top-level {theta:g} is used.")
    unmodelled = []
    for key, spec in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not spec:
            continue
        kind = spec.get("rope_type", spec.get("type"))
        if kind == "default" or (kind is None and set(spec) <= {"rope_theta"}):
            continue
        rest = {k: v for k, v in spec.items() if k != "rope_theta"}
        if any(rest == {k: v for k, v in s.items() if k != "rope_theta"} for _, s in unmodelled):
            continue  # the same scaling written under both keys: one note
        unmodelled.append((key, spec))
    for key, spec in unmodelled:
        notes.append(f"{key} {_brief(spec)} is not modelled: RoPE uses plain theta={theta:g}; "
                     "costs are unaffected, logits differ from the real model.")
    return theta


def yarn_spec(r: HFReader):
    """The YaRN object of rope_scaling / rope_parameters as (key, spec), or None when RoPE is not YaRN."""
    for key in ("rope_scaling", "rope_parameters"):
        spec = r.d.get(key)
        if isinstance(spec, dict) and spec.get("rope_type", spec.get("type")) == "yarn":
            return key, spec
    return None


def yarn(r: HFReader) -> tuple:
    """YaRN's parameters (kernels.rope.rope_tables) from rope_parameters / rope_scaling, () when not YaRN."""
    found = yarn_spec(r)
    if found is None:
        return ()
    key, spec = found
    orig = int_field(r.where, f"{key}.original_max_position_embeddings",
                     spec.get("original_max_position_embeddings", r.get("max_position_embeddings", 4096)), 1)
    factor = spec.get("factor")
    factor = (r.d.get("max_position_embeddings", orig) / orig if factor is None
              else float_field(r.where, f"{key}.factor", factor))

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    att = spec.get("attention_factor")
    if att is None:
        m, m_all = spec.get("mscale"), spec.get("mscale_all_dim")
        att = get_mscale(factor, m) / get_mscale(factor, m_all) if m and m_all else get_mscale(factor)
    return (float(factor), float(spec.get("beta_fast") or 32), float(spec.get("beta_slow") or 1), orig,
            float(att), bool(spec.get("truncate", True)))


def rope_with_yarn(r: HFReader) -> float:
    """The shared RoPE reading: the base (scaling as a note), and YaRN into ``r.arch`` (modelled: not a note)."""
    theta = rope_theta(r.d, r.where, r.notes)
    params = yarn(r)
    if params:
        r.arch["rope_yarn"] = params
        r.notes[:] = [n for n in r.notes if '"yarn"' not in n]
    return theta
