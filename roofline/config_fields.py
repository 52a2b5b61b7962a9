"""Input validation shared by every reader of a user's file: model configs (``roofline.models``, the
config.json readers of ``roofline.families``) and device files (``roofline.devices``).

``read_json_file`` parses a file or says in one line why it cannot; ``show_value`` writes a value back as
the user wrote it; ``int_field`` / ``float_field`` / ``bool_field`` check one field; ``check_sizes`` is the
one validation of a model's sizes (``ModelConfig.__post_init__`` and the config.json reader both call it).
Every failure is a one-line ``RooflineError`` naming the field, the value, the rule and what to do.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path

from .errors import RooflineError


class _Written(float):
    """A JSON number that does not fit a finite float (1e400): remembers how it was written."""

    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj.text = text
        return obj


def _parse_float(text: str) -> float:
    v = float(text)
    return v if math.isfinite(v) else _Written(text)


def show_value(v, limit: int = 80) -> str:
    """A value as the user wrote it in JSON (true, null, "4096", Infinity), with its kind where that is the problem."""
    if isinstance(v, bool):
        return f"{'true' if v else 'false'} (a boolean)"
    if v is None:
        return "null"
    if isinstance(v, _Written):
        return f"{v.text} (too large for a number)"
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    try:
        s = json.dumps(v, allow_nan=True)
    except (TypeError, ValueError):
        s = repr(v)
    if len(s) > limit:
        s = s[: limit - 3] + "..."
    if isinstance(v, str):
        return f"{s} (a string)"
    if isinstance(v, (list, tuple)):
        return f"{s} (a list)"
    return s


def read_json_file(path, what: str):
    """The parsed JSON of a file, or a one-line RooflineError: missing, a folder, unreadable, not text, not JSON."""
    p = Path(path)
    where = f"{what} {p}"
    if p.is_dir():
        raise RooflineError(f"{where} is a folder, not a file: give the path of the JSON file itself.")
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise RooflineError(f"{where} does not exist.") from None
    except PermissionError:
        raise RooflineError(f"{where} cannot be read (permission denied): check its permissions.") from None
    except OSError as e:
        raise RooflineError(f"{where} cannot be read ({e.strerror or e}): give a readable JSON file.") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RooflineError(f"{where} is not a UTF-8 text file (byte 0x{raw[e.start]:02x} at offset {e.start}): "
                            "give a JSON file.") from None
    try:
        return json.loads(text, parse_float=_parse_float)
    except json.JSONDecodeError as e:
        raise RooflineError(f"{where} is not valid JSON (line {e.lineno}): {e.msg}.") from None
    except RecursionError:
        raise RooflineError(f"{where} is nested too deeply to be a config: give a flat JSON object.") from None


def is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def int_field(where: str, name: str, value, minimum: int = 1, hint: str = "") -> int:
    """``value`` as an int >= ``minimum`` (an integral float such as 4096.0 counts), else RooflineError."""
    ok = False
    if is_number(value):
        try:
            ok = float(value).is_integer() and int(value) >= minimum
        except OverflowError:  # an int too large for a float is still an int
            ok = isinstance(value, int) and value >= minimum
    if not ok:
        rule = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise RooflineError(f"{where}: {name} must be {rule}{hint}, but {show_value(value)} was given.")
    return int(value)


def float_field(where: str, name: str, value, hint: str = "") -> float:
    """``value`` as a positive, finite float, else RooflineError."""
    try:
        ok = is_number(value) and math.isfinite(float(value)) and float(value) > 0
    except OverflowError:
        ok = False
    if not ok:
        raise RooflineError(f"{where}: {name} must be a positive finite number{hint}, but {show_value(value)} "
                            "was given.")
    return float(value)


def bool_field(where: str, name: str, value) -> bool:
    """``value`` itself when it is a JSON boolean, else RooflineError."""
    if not isinstance(value, bool):
        raise RooflineError(f"{where}: {name} must be true or false (a JSON boolean, not a string or number), "
                            f"but {show_value(value)} was given.")
    return value


INT_FIELDS = ("hidden", "intermediate", "n_layers", "n_heads", "n_kv_heads", "vocab", "max_context")
SIZE_FIELDS = INT_FIELDS + ("head_dim", "rope_theta", "rms_eps", "tie_embeddings")   # what check_sizes checks
# The largest size each field may take: far past every published model (Llama-3.1-405B: 126 layers, hidden 16384,
# MLP 53248; Gemma-3: a 262,144-token vocabulary; Llama-4-Scout: a 10M-token context), and small enough that the
# per-layer tuples of a model, and its tables, are built in bounded memory before anything else is checked.
MAX_SIZES = {"hidden": 1 << 17, "intermediate": 1 << 20, "n_layers": 4096, "n_heads": 1 << 14,
             "n_kv_heads": 1 << 14, "vocab": 1 << 24, "max_context": 1 << 28, "head_dim": 1 << 14,
             # mixtures of experts and latent attention (DeepSeek-V3: 256 experts, kv_lora_rank 512)
             "n_experts": 1 << 16, "n_active": 1 << 16, "moe_intermediate": 1 << 20, "shared_intermediate": 1 << 20,
             "q_lora_rank": 1 << 17, "kv_lora_rank": 1 << 17, "qk_rope_dim": 1 << 14, "qk_nope_dim": 1 << 14,
             "v_head_dim": 1 << 14}


def bounded(where: str, name: str, value: int, limit: int) -> int:
    """``value`` when it is at most ``limit``, else a one-line RooflineError naming the field, the value and the
    bound (a size no model has: allocating it would exhaust memory before anything said so)."""
    if value > limit:
        shown = f"{value:,}" if value < 10 ** 30 else f"an integer of {len(str(value))} digits"
        raise RooflineError(f"{where}: {name} is {shown}, past the largest this tool models ({limit:,}; no published "
                            "model comes near it): check the config for a typo.")
    return value


def check_sizes(v: dict, where: str, names: dict, hints: dict) -> dict:
    """The one validation of a model's sizes: ``v`` (our field names) -> normalised values, or RooflineError.

    ``names``/``hints`` say how the fields are spelled where they came from (the dataclass or a config.json).
    """
    out = {f: bounded(where, names[f], int_field(where, names[f], v[f], 1, hints.get(f, "")), MAX_SIZES[f])
           for f in INT_FIELDS}
    hd = bounded(where, names["head_dim"], int_field(where, names["head_dim"], v["head_dim"], 0,
                                                     hints.get("head_dim", "")), MAX_SIZES["head_dim"])
    h, nh, nkv = out["hidden"], out["n_heads"], out["n_kv_heads"]
    N = names.get
    derived = hd == 0
    if derived:
        if h % nh:
            raise RooflineError(f"{where}: {N('hidden')} ({h}) must be a multiple of {N('n_heads')} ({nh}) when no "
                                f"head_dim is given; give head_dim explicitly or fix the sizes.")
        hd = h // nh
    if hd % 2:
        how = f" ({N('hidden')} {h} / {N('n_heads')} {nh})" if derived else ""
        raise RooflineError(f"{where}: head_dim must be even (RoPE rotates pairs of dimensions), but it is {hd}{how}; "
                            "give an even head_dim.")
    if nh % nkv:
        raise RooflineError(f"{where}: {N('n_heads')} ({nh}) must be a multiple of {N('n_kv_heads')} ({nkv}) "
                            "(each key/value head serves a whole group of query heads); fix one of them.")
    out["head_dim"] = hd
    out["rope_theta"] = float_field(where, N("rope_theta"), v["rope_theta"], " (the RoPE base, e.g. 10000)")
    out["rms_eps"] = float_field(where, N("rms_eps"), v["rms_eps"], " (e.g. 1e-05)")
    out["tie_embeddings"] = bool_field(where, N("tie_embeddings"), v["tie_embeddings"])
    return out
