"""Real weights: a Hugging Face checkpoint folder (config.json + *.safetensors) into our model's weights.

    w, info = load_weights(cfg, folder, torch.float32, "cpu")      # init_weights's layout, real values

Every tensor is found through ``roofline.layer``'s WeightSpecs (their ``hf`` names), so a new
architecture loads with no change here. Linear weights are stored [out, in] by transformers and
become [in, out]; a fused tensor (Phi-3's qkv_proj, gate_up_proj) is split along its outputs by the
spec's ``part``; a (1 + w) norm (Gemma) is stored as the multiplier 1 + w, added in fp32 before the
cast. A tied lm_head is the embedding's transpose. A tensor the ops need and the files lack, or a
tensor the files hold and no op reads, is a one-line error: the model would not be the checkpoint's.
``info`` says what was loaded: files, their total bytes, and a sha256 over their contents (recorded
in result files).

A quantized checkpoint (``cfg.quantization``: each op's stored format is ``roofline.layer.precision_of``'s) is
read by ``kernels.checkpoint_quant``'s reader of its layout, exactly. With ``backend`` named (the model's), a weight
whose format that backend's model runs stays in it (``QuantWeight`` / ``QuantExperts``: the torch backend every
registered format, fp8 through ``kernels.linear_fp8``, FP4 through ``kernels.fp4``; the triton backend every format
with a Triton linear, and as routed experts those the fused MoE takes: ``runs_as_stored``); any other is dequantized
exactly and cast to ``dtype``. Either way ``info["notes"]`` says so, one sentence per module class and format
("experts: mxfp4 checkpoint, dequantized exactly at load (...), into float32; a run holds it as its precision says
..."): never silent.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import torch

from roofline.errors import RooflineError
from roofline.layer import model_ops, precision_of
from roofline.models import ModelConfig
from roofline.precision.checkpoint import TEXT_PREFIXES
from roofline.precision.modules import WEIGHT_ROLES

from . import checkpoint_quant as CQ
from .moe import QUANT_CODES as FUSED_MOE_FORMATS
from .quant import ABSORBED_KV_B, absorbed_kv_b, quantized_ops
from .quant_weight import FORMATS, QuantExperts
from .safetensors_files import files_sha256, open_all, weight_files
from .weights import layer_weights

# Buffers some checkpoints carry that are recomputed, not weights (RoPE's inverse frequencies).
_IGNORED = ("rotary_emb.inv_freq",)
# Where the decoder's tensors sit in the files: a causal LM's "model.", a multimodal model's text part, or Nemotron-H's
# "backbone." (its checkpoints' backbone.embeddings, backbone.layers.N.mixer..., backbone.norm_f).
_PREFIXES = (*TEXT_PREFIXES, "backbone.", "")


def runs_as_stored(backend, dtype: str, role: str = "linear", device=None) -> bool:
    """Whether ``backend``'s model runs a weight of our kernels' ``dtype`` (a ``QuantWeight.dtype``) in WeightSpec
    ``role`` as stored: the torch backend every registered format (``kernels.quant_weight.FORMATS``); the triton
    backend every format with a Triton linear (``triton_linear``), and as routed experts those the fused MoE takes
    (``kernels.moe.QUANT_CODES``), except on a GPU older than the tensor cores its kernels quantize the activations
    for (the format's ``acts``: fp8's W8A8 linear on sm_80); None (no backend named): none."""
    if backend == "triton":
        if dtype not in (FUSED_MOE_FORMATS if role == "experts" else
                         [d for d, f in FORMATS.items() if f.triton_linear is not None]):
            return False
        act = FORMATS[dtype].acts.get(role)
        dev = torch.device(device) if device is not None else None
        return (act is None or act.native is None or dev is None or dev.type != "cuda"
                or torch.cuda.get_device_capability(dev) >= act.native)
    return backend == "torch" and dtype in FORMATS


class QuantLoad:
    """How a quantized checkpoint's weights are loaded: each op's stored format (``precision_of``), its reader
    (``kernels.checkpoint_quant``), and one note per module class and format saying what the model runs."""

    def __init__(self, cfg: ModelConfig, src, dtype, device, backend):
        self.q, self.src, self.dtype, self.device, self.backend = cfg.quantization, src, dtype, device, backend
        self.prec = precision_of(cfg)
        self.config = self.q.to_dict()["config"] if self.q else {}
        self.notes: dict = {}
        self.mla_up = {key for _, key, kind, _ in quantized_ops(cfg) if kind == "mla_up"}

    def format_of(self, op, ws):
        f = self.prec.weight(op) if self.q is not None and ws.role in WEIGHT_ROLES else None
        return f if f is not None and f.quantized else None

    def read(self, op, ws, fmt, name: str):
        """(float tensor in the file's layout, or None; our kernels' weight in our layout, or None)."""
        if ws.role == "experts" and "{e}" in name:       # one tensor per expert: dequantized, stacked [E, out, in]
            reads = [CQ.read(self.src, self.q.method, fmt, name.format(e=e), self.config) for e in range(ws.shape[0])]
            exact, ours, caveat = torch.stack([r.exact for r in reads]), None, reads[0].caveat
            why = "per-expert tensors are stacked dequantized"
        else:
            r = CQ.read(self.src, self.q.method, fmt, name, self.config)
            exact, caveat = r.exact, r.caveat
            ours = r.ours(self.dtype) if r.ours is not None else None
            why = self.why_not(ws, ours)
        if why:
            self.note(op, fmt, f"dequantized exactly at load ({why}), into {_dtype(self.dtype)}; a run holds it as its "
                               "precision says (kernels.run_precision: re-quantized where it runs quantized)")
            return exact.transpose(-1, -2) if ws.role == "experts" and "{e}" in name else exact, None
        if ws.part:                                       # gpt-oss's interleaved gate_up: rows of N
            ours = slice_out(ours, ws.part[1])
        if tuple(ours.shape) != tuple(ws.shape):
            raise RooflineError(f"checkpoint tensor {name!r} holds a [{', '.join(map(str, ours.shape))}] weight where "
                                f"the config says {list(ws.shape)} (our layout): the files and the config do not "
                                "belong together.")
        self.note(op, fmt, f"run as stored ({ours.dtype} on the {self.backend} backend"
                           + (f"; {caveat}" if caveat else "") + ")")
        return None, to_device(ours, self.device)

    def why_not(self, ws, ours) -> str:
        if ours is None:
            return "our kernels have no reader of this layout"
        if not runs_as_stored(self.backend, ours.dtype, ws.role, self.device):
            return (f"the {self.backend} backend's model does not run {ours.dtype} weights" if self.backend else
                    "re-quantized by a weight-dtype flag, or sharded for tensor parallelism")
        if ws.rope or (ws.part and ws.part[0] != "interleave"):
            return "a fused or reordered tensor"
        return ""

    def note(self, op, fmt, what: str) -> None:
        self.notes.setdefault((op.module, fmt.name, what), f"{op.module}: {fmt.name} checkpoint, {what}.")


def _dtype(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def slice_out(q, start: int):
    """Every other output feature (``start``, start + 2, ...) of quantized experts (their rows of N)."""
    z = None if q.zeros is None else q.zeros[:, start::2]
    return QuantExperts(q.dtype, q.qweight[:, start::2].contiguous(), q.scales[:, start::2].contiguous(), z,
                        q.in_features, q.out_features // 2, q.group_size, tensor_scale=q.tensor_scale, act=q.act)


def to_device(q, device):
    """A quantized weight with its tensors on ``device``."""
    moved = {k: getattr(q, k).to(device) for k in ("qweight", "scales", "zeros", "tensor_scale")
             if getattr(q, k) is not None}
    return replace(q, **moved, **({"views": ()} if isinstance(q, QuantExperts) else {}))


def load_weights(cfg: ModelConfig, folder, dtype: torch.dtype, device, *, layers=None,
                 backend: str | None = None) -> tuple[dict, dict]:
    """The checkpoint's weights in ``init_weights``'s layout (``layers``: only these layer indices, e.g. [0]
    for a one-layer runner; default all). Returns (weights, info). A quantized checkpoint (``cfg.quantization``)
    is read exactly (``kernels.checkpoint_quant``); a weight whose format ``backend``'s model runs stays in it
    (``QuantWeight`` / ``QuantExperts``), any other is dequantized to ``dtype``; ``info["notes"]`` says which."""
    files = weight_files(folder)
    if not files:
        raise RooflineError(f"checkpoint folder {folder} holds no *.safetensors files: give the folder the "
                            "model was saved to (save_pretrained writes model.safetensors).")
    names, where = open_all(files)
    ql = QuantLoad(cfg, CQ.Source(where, names, str(folder)), dtype, device, backend)
    prefix = next((p for p in _PREFIXES if any(k.startswith(f"{p}layers.0.{_first_layer_name(cfg)}".removesuffix(
        ".weight")) for k in where)), None)
    if prefix is None:
        raise RooflineError(f"checkpoint {folder} has no tensor named like "
                            f"'model.layers.0.{_first_layer_name(cfg)}': is it a {cfg.arch} checkpoint?")
    used = ql.src.used
    op_of = {id(ws): o for o in model_ops(cfg) for ws in o.weights}

    def get(name: str) -> torch.Tensor:
        if name not in where:
            raise RooflineError(f"checkpoint {folder} lacks the tensor {name!r} that a {cfg.arch} model with this "
                                "config.json reads: the files and the config do not belong together.")
        used.add(name)
        return where[name].get_tensor(name)

    def convert(ws, name: str):
        fmt = ql.format_of(op_of[id(ws)], ws)
        t = None
        if fmt is not None:
            t, ours = ql.read(op_of[id(ws)], ws, fmt, name)
            if ours is not None:
                return ours
        if t is None and ws.role == "experts" and "{e}" in name:   # one [out, in] tensor per expert -> [E, in, out]
            t = torch.stack([get(name.format(e=e)).t() for e in range(ws.shape[0])])
        elif t is None:
            t = get(name)
        return _convert(ws, name, t, dtype, device)

    ops = model_ops(cfg)
    edge = {ws.key: ws for o in ops if not o.per_layer for ws in o.weights}
    w = {"embed": convert(edge["embed"], edge["embed"].hf.replace("model.", prefix, 1)),
         "final_norm": convert(edge["final_norm"], edge["final_norm"].hf.replace("model.", prefix, 1)),
         "layers": []}
    for i in (range(cfg.n_layers) if layers is None else layers):
        lw = {ws.key: convert(ws, f"{prefix}layers.{i}.{ws.hf}") for ws in layer_weights(ops, i)}
        lw.update({ABSORBED_KV_B: absorbed_kv_b(lw[k], dtype) for k in ql.mla_up if k in lw and not torch.is_tensor(lw[k])})
        w["layers"].append(lw)
    if cfg.tie_embeddings:
        w["lm_head"] = w["embed"].t()
        used.add("lm_head.weight")       # some tied checkpoints still write it
    else:        # a causal LM's lm_head.weight, or one nested in a wrapper (Llama-4's language_model.lm_head.weight)
        nested = prefix.removesuffix("model.") + "lm_head.weight"
        w["lm_head"] = convert(edge["lm_head"], nested if nested in where and "lm_head.weight" not in where
                               else "lm_head.weight")
    _refuse_extra(cfg, folder, where, used, prefix, set(range(cfg.n_layers) if layers is None else layers))
    info = describe(folder)
    if ql.notes:
        info["notes"] = sorted(ql.notes.values())
    return w, info


def _convert(ws, name: str, t: torch.Tensor, dtype, device) -> torch.Tensor:
    """A float tensor in the file's layout -> ours: a fused tensor's part, DeepSeek's rope order, [in, out]."""
    if ws.out_in and t.dim() == 3:   # [E, out, in] (transformers 5's layout), read first as transformers does
        out = sum(ws.part[1]) if ws.part and ws.part[0] != "interleave" else ws.shape[2]
        if tuple(t.shape[1:]) == (out, ws.shape[1]):
            t = t.transpose(1, 2)
    if ws.part and ws.part[0] == "interleave":   # GPT-OSS's gate_up: gate = [..., 0::2], up = [..., 1::2]
        t = t[..., ws.part[1]::2]
    elif ws.part and ws.role == "experts":       # Qwen3-VL-MoE's, Llama-4's gate_up [E, H, 2I]: gate = [..., :I], up = [..., I:]
        i, sizes = ws.part
        t = t[..., sum(sizes[:i]): sum(sizes[: i + 1])]
    elif ws.part:                    # one slice of a fused tensor along its outputs (HF rows)
        i, sizes = ws.part
        t = t[sum(sizes[:i]): sum(sizes[: i + 1])]
    if ws.rope:                      # DeepSeek / ERNIE store rope dims interleaved: reorder them to halves
        width, off, dim = ws.rope
        shape = t.shape
        t = t.reshape(-1, width, shape[-1] if t.dim() > 1 else 1)   # a bias: one column
        order = torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)]) + off
        t = torch.cat([t[:, :off], t[:, order], t[:, off + dim:]], dim=1).reshape(shape)
    if ws.role == "vector" and t.dim() == 2 and t.shape[0] == 1:
        t = t[0]                     # ERNIE keeps its correction bias as [1, E]
    if ws.role == "vector" and t.dim() == 3 and t.shape[1] == 1:
        t = t[:, 0]                  # a depthwise Conv1d's weight [C, 1, kernel] (Gated DeltaNet's conv1d)
    if ws.role == "linear":
        t = t.t()
    if tuple(t.shape) != tuple(ws.shape):
        raise RooflineError(f"checkpoint tensor {name!r} has shape {list(t.shape)} where the config says "
                            f"{list(ws.shape)} (our layout): the files and the config do not belong together.")
    t = t.to(torch.float32) if t.dtype != torch.float64 else t
    if ws.offset:
        t = t + 1.0                  # Gemma's norms multiply by (1 + w)
    return t.to(dtype=dtype, device=device).contiguous()


def _refuse_extra(cfg, folder, where, used, prefix, loaded) -> None:
    """A tensor of the decoder (a loaded layer's, or outside the layers) that no op read: one line."""
    def read_by_us(k: str) -> bool:
        m = re.match(re.escape(prefix) + r"layers\.(\d+)\.", k)
        return int(m.group(1)) in loaded if m else (k.startswith(prefix) or k.startswith("lm_head"))

    extra = sorted(k for k in where if k not in used and not k.endswith(_IGNORED) and read_by_us(k))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        raise RooflineError(f"checkpoint {folder} holds tensors no op of a {cfg.arch} model reads: "
                            f"{', '.join(extra[:3])}{more}; that part of the model is not modelled.")


def _first_layer_name(cfg: ModelConfig) -> str:
    return next(ws.hf for o in model_ops(cfg) if o.per_layer for ws in o.weights)


_DESCRIBED: dict = {}   # (folder, (name, size, mtime_ns) per file) -> its description: hashed once per process


def describe(folder) -> dict:
    """What a checkpoint folder holds, for a result file's header: {"weights": "checkpoint", folder, files,
    bytes, sha256}, or {"weights": "random (seeded)"} without weight files."""
    files = weight_files(folder) if folder else []
    if not files:
        return {"weights": "random (seeded)"}
    stats = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    key = (str(Path(folder).resolve()), stats)
    if key not in _DESCRIBED:
        _DESCRIBED[key] = {"weights": "checkpoint", "folder": key[0], "files": [f.name for f in files],
                           "bytes": sum(s[1] for s in stats), "sha256": files_sha256(files)}
    return dict(_DESCRIBED[key])
