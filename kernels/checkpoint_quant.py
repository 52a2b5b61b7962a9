"""Quantized checkpoints' tensors: one reader per stored layout, exact (``LAYOUTS``: (quant method, the registry's
weight format name) -> reader), used by ``kernels.checkpoint.load_weights``.

A reader takes a module's tensors (``Source``: the files' tensors by name; a missing one, or one of the wrong
dtype or shape, is a one-line error naming the tensor and its file) and gives a ``Read``: the weight dequantized
exactly (fp64, in the float checkpoint's layout: Linear [out, in]; gpt-oss's experts [E, in, out]) and, where our
kernels read the layout as stored, that weight in our [K, N] layout (``QuantWeight`` / ``QuantExperts``):

- ``fp8`` / ``fp8-block`` (DeepSeek-V3, Qwen3-FP8): ``weight`` e4m3 [N, K], ``weight_scale_inv`` fp32
  [ceil(N/128), ceil(K/128)]; w = q * scale. ``kernels.linear_fp8``'s "fp8-block" as stored.
- compressed-tensors / ModelOpt FP8: ``weight`` e4m3 [N, K], ``weight_scale`` fp32 per tensor ([] or [1]) or per
  output channel ([N, 1]); ``input_scale`` (a static activation scale) read and checked, but our fp8 GEMM
  quantizes activations dynamically (per token): said in the note. ``kernels.linear_fp8``'s "fp8-tensor" / "fp8".
- mxfp4 (gpt-oss experts): ``*_blocks`` uint8 [E, N, K/32, 16], ``*_scales`` uint8 (e8m0) [E, N, K/32]:
  ``kernels.fp4``'s qweight [E, N, K/2] (low nibble even k, as transformers unpacks) and scales as stored.
- ModelOpt NVFP4: ``weight`` uint8 [N, K/2], ``weight_scale`` e4m3 [N, K/16], ``weight_scale_2`` fp32 [],
  ``input_scale`` fp32 []; w = e2m1 * weight_scale * weight_scale_2: ``kernels.fp4``'s "nvfp4" as stored.
- GPTQ int4 (desc_act false): ``qweight`` int32 [K/8, N] (k = 8i + j in bits 4j..4j+3 of row i), ``qzeros``
  int32 [K/g, N/8] (likewise along N; gptq v1 stores z - 1), ``scales`` fp16 [K/g, N], ``g_idx`` int32 [K] which
  must be k // g (a permuted one, desc_act true, is refused); w = (q - z) * s. Ours: ``kernels.linear_int4``'s
  int4 with zero points, u = q, zero = (8 - z) * s (so (u - 8) s + zero = (q - z) s): exact where the activation
  dtype holds (8 - z) * s exactly (fp32; bf16 / fp16 round it: said in the note).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from roofline.errors import RooflineError

from . import fp4, linear_fp8, linear_int4
from .quant_weight import QuantExperts, QuantWeight

E4M3, F32, U8, I32, F16 = torch.float8_e4m3fn, torch.float32, torch.uint8, torch.int32, torch.float16


@dataclass
class Source:
    """The checkpoint's tensors by name (``where``: name -> safe_open handle, ``files``: handle -> file name);
    ``used`` collects what was read."""

    where: dict
    files: dict
    folder: str
    used: set = field(default_factory=set)

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str, dtype=None, shape=None, *, layout: str = "") -> torch.Tensor:
        """Tensor ``name`` (its dtype and shape checked when given); one line naming it and its file else."""
        if name not in self.where:
            raise RooflineError(f"checkpoint {self.folder} lacks the tensor {name!r} that the {layout} layout of "
                                "its quantization_config stores: the files and the config do not belong together.")
        self.used.add(name)
        t = self.where[name].get_tensor(name)
        f = self.files[id(self.where[name])]
        if dtype is not None and t.dtype != dtype:
            raise RooflineError(f"checkpoint tensor {name!r} in {f} is {t.dtype} where the {layout} layout stores "
                                f"{dtype}.")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise RooflineError(f"checkpoint tensor {name!r} in {f} has shape {list(t.shape)} where the {layout} "
                                f"layout stores {list(shape)}.")
        return t


@dataclass(frozen=True)
class Read:
    """One weight as read: ``exact`` (fp64, the float checkpoint's layout), ``ours`` (a function of the activation
    dtype giving our kernels' QuantWeight / QuantExperts, [K, N]; None where none reads it as stored), and what
    running ``ours`` differs in (``caveat``, for the note)."""

    exact: torch.Tensor
    ours: object = None
    caveat: str = ""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _base(name: str) -> str:
    return name.removesuffix(".weight")


def fp8_block(src: Source, name: str, fmt, qc: dict) -> Read:
    b = _base(name)
    q = src.get(f"{b}.weight", E4M3, layout=fmt.name)
    N, K = q.shape
    s = src.get(f"{b}.weight_scale_inv", F32, (_cdiv(N, 128), _cdiv(K, 128)), layout=fmt.name)
    qw = QuantWeight("fp8-block", q.contiguous(), s.contiguous(), None, K, N, 128)
    return Read(linear_fp8.dequantize(qw, torch.float64).t(), lambda act: qw)


def fp8_scaled(src: Source, name: str, fmt, qc: dict) -> Read:
    """compressed-tensors / ModelOpt FP8: per-tensor or per-channel ``weight_scale``, optional ``input_scale``."""
    b = _base(name)
    q = src.get(f"{b}.weight", E4M3, layout=fmt.name)
    N, K = q.shape
    per_channel = bool(fmt.scales.n)
    s = src.get(f"{b}.weight_scale", F32, layout=fmt.name)
    want = (N,) if per_channel else (1,)
    if s.numel() != want[0] or (per_channel and s.dim() != 2 and s.dim() != 1):
        raise RooflineError(f"checkpoint tensor {b}.weight_scale in {src.files[id(src.where[f'{b}.weight_scale'])]} "
                            f"has shape {list(s.shape)} where the {fmt.name} layout stores "
                            f"{'[N, 1] = ' + str([N, 1]) if per_channel else '[] or [1]'}.")
    caveat = ""
    if src.has(f"{b}.input_scale"):
        x = src.get(f"{b}.input_scale", F32, layout=fmt.name)
        if x.numel() != 1:
            raise RooflineError(f"checkpoint tensor {b}.input_scale has shape {list(x.shape)} where the {fmt.name} "
                                "layout stores one fp32 per tensor.")
        caveat = ("its static input_scale is read but not applied: our fp8 GEMM quantizes activations "
                  "dynamically per token")
    qw = QuantWeight(fmt.name, q.contiguous(), s.reshape(want).contiguous(), None, K, N, 0)
    return Read(linear_fp8.dequantize(qw, torch.float64).t(), lambda act: qw, caveat)


def mxfp4_experts(src: Source, name: str, fmt, qc: dict) -> Read:
    """gpt-oss: ``{name}_blocks`` [E, N, K/32, 16], ``{name}_scales`` [E, N, K/32] -> [E, K, N] (its float layout)."""
    blocks = src.get(f"{name}_blocks", U8, layout=fmt.name)
    if blocks.dim() != 4 or blocks.shape[-1] != 16:
        raise RooflineError(f"checkpoint tensor {name}_blocks has shape {list(blocks.shape)} where the mxfp4 layout "
                            "stores [E, N, K/32, 16].")
    E, N, G, _ = blocks.shape
    scales = src.get(f"{name}_scales", U8, (E, N, G), layout=fmt.name)
    K = G * 32

    def ours(act):
        return QuantExperts("mxfp4", blocks.reshape(E, N, K // 2).contiguous(), scales.contiguous(), None, K, N, 32,
                            act=act)
    return Read(ours(torch.float32).dequantize(torch.float64), ours)


def nvfp4(src: Source, name: str, fmt, qc: dict) -> Read:
    b = _base(name)
    q = src.get(f"{b}.weight", U8, layout=fmt.name)
    N, K = q.shape[0], q.shape[1] * 2
    s = src.get(f"{b}.weight_scale", E4M3, (N, K // 16), layout=fmt.name)
    s2 = src.get(f"{b}.weight_scale_2", F32, layout=fmt.name)
    if s2.numel() != 1:
        raise RooflineError(f"checkpoint tensor {b}.weight_scale_2 has shape {list(s2.shape)} where the nvfp4 "
                            "layout stores one fp32 per tensor.")
    caveat = ""
    if src.has(f"{b}.input_scale"):
        src.get(f"{b}.input_scale", F32, layout=fmt.name)
        caveat = "its input_scale is read but not applied: the activations stay in the activation dtype (W4A16)"

    def ours(act):
        return QuantWeight("nvfp4", q.contiguous(), s.contiguous(), None, K, N, 16, tensor_scale=s2.reshape(()),
                           act=act)
    return Read(fp4.dequantize(ours(torch.float32), torch.float64).t(), ours, caveat)


def _nibbles(t: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 packing 8 int4 along ``dim`` (value j in bits 4j..4j+3) -> the int64 values, 8x longer on ``dim``."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    v = (t.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF                   # [..., 8]
    if dim == 0:
        return v.permute(0, 2, 1).reshape(-1, t.shape[1])
    return v.reshape(t.shape[0], -1)


def gptq_int4(src: Source, name: str, fmt, qc: dict) -> Read:
    b, g = _base(name), fmt.group_size
    v2 = qc.get("checkpoint_format") == "gptq_v2"          # v1 stores z - 1, v2 z
    qweight = src.get(f"{b}.qweight", I32, layout="gptq")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    qzeros = src.get(f"{b}.qzeros", I32, (_cdiv(K, g), _cdiv(N, 8)), layout="gptq")
    scales = src.get(f"{b}.scales", F16, (_cdiv(K, g), N), layout="gptq")
    if src.has(f"{b}.g_idx"):
        g_idx = src.get(f"{b}.g_idx", I32, (K,), layout="gptq")
        if not torch.equal(g_idx.long(), torch.arange(K) // g):
            raise RooflineError(f"checkpoint tensor {b}.g_idx is not k // {g} (desc_act true: a permuted row order): "
                                "only desc_act false GPTQ checkpoints are read.")
    q = _nibbles(qweight, 0)                                                 # [K, N]
    z = _nibbles(qzeros, 1)[:, :N] + (0 if v2 else 1)                        # [K/g, N]
    s = scales.double()
    exact = ((q - z.repeat_interleave(g, 0)).double() * s.repeat_interleave(g, 0)).t()   # [N, K]

    def ours(act):
        zero = ((8 - z).double() * s).to(act)
        return QuantWeight("int4", linear_int4.pack(q.t().to(torch.int32).contiguous()), scales.to(act).contiguous(),
                           zero.contiguous(), K, N, group_size=g)
    return Read(exact, ours, "its fp16 scales and zero points (8 - z) * s are held in the activation dtype "
                             "(exact in fp32)")


# (quant method, weight format) -> reader(src, name, format, quantization_config) -> Read; None: not read (refused)
LAYOUTS = {("fp8", "fp8-block"): fp8_block,
           ("compressed-tensors", "fp8-block"): None,
           ("compressed-tensors", "fp8-tensor"): fp8_scaled, ("compressed-tensors", "fp8"): fp8_scaled,
           ("modelopt", "fp8-tensor"): fp8_scaled, ("modelopt", "nvfp4"): nvfp4,
           ("mxfp4", "mxfp4"): mxfp4_experts,
           ("gptq", "gptq-int4"): gptq_int4}


def read(src: Source, method: str, fmt, name: str, quant_config: dict) -> Read:
    """Weight ``name`` of a ``method`` checkpoint stored in ``fmt``: its reader's ``Read``; a layout with no reader is
    refused in one line."""
    reader = LAYOUTS.get((method, fmt.name))
    if reader is None:
        have = ", ".join(f"{m} {f}" for (m, f), r in LAYOUTS.items() if r)
        raise RooflineError(f"checkpoint {src.folder}: {method} weights in {fmt.describe()} ({name}) have no reader "
                            f"(read: {have}).")
    return reader(src, name, fmt, quant_config)
