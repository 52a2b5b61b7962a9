"""The quantized weights' containers and the formats that fill them: ``QuantWeight`` (a [K, N] weight as its
kernel reads it), ``QuantExperts`` (E of them stacked, as the fused MoE kernels read them), the int4 group
check, the torch backend's op lookup (``aten``: one place, so a test can take an op away) and the format
registry (``FORMATS``: weight dtype -> how it quantizes, dequantizes, prepares and runs on either backend, and how
a tensor-parallel shard is cut from it). ``kernels.linear_int8``, ``kernels.linear_int4``, ``kernels.linear_fp8``
(fp8, fp8-tensor, fp8-block) and ``kernels.linear_fp4`` (mxfp4, nvfp4) register their formats (``register_format``);
``kernels.quant`` holds the rules over whole models. This module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from types import SimpleNamespace

import torch

from roofline.errors import RooflineError
from roofline.formulas import INT4_GROUP
from roofline.workload import INT4_GROUPS

FORMATS: dict = {}     # weight dtype -> SimpleNamespace(quantize, dequantize, prepare_torch, torch_linear, ...)


def register_format(dtype: str, *, quantize, dequantize, prepare_torch, torch_linear, triton_linear, triton_config,
                    slice, pad_out, acts=None, torch_expert=None, torch_expert_impl: str = "") -> None:
    """Register weight dtype ``dtype``'s format (its kernel module's functions). ``triton_linear(x, qw, bias,
    **config)``: the triton backend's linear (``kernels.backend``), ``triton_config(qw, M, dtype, device)`` the tiles
    it runs for M rows (what a sweep records); ``torch_linear(x, qw, bias)``: the torch backend's. ``slice(q, axis, start, stop)``: rows ``start:stop`` of a ``QuantWeight`` / ``QuantExperts`` along
    the float weight's "out" (N) or "in" (K) axis, exact (``kernels.quant.slice_quant``); ``pad_out(q, n)``: zero
    output channels appended up to n (they dequantize to 0). ``acts``: {op kind: the ``roofline.precision``
    activation Format its kernels quantize the inputs to} ("linear": fp8's W8A8 GEMM quantizes x per token or per
    1 x 128 group); a kind absent runs weight-only (the weight dequantized in registers, the activations in their
    own dtype). What a run costs follows it (``kernels.run_precision``). ``torch_expert(x, qw)``: the torch
    backend's GEMM of one routed expert (``kernels.moe.torch_moe``), labelled ``torch_expert_impl``; None: the
    expert's ``torch_linear`` (what ``prepare_torch`` chose)."""
    FORMATS[dtype] = SimpleNamespace(quantize=quantize, dequantize=dequantize, prepare_torch=prepare_torch,
                                     torch_linear=torch_linear, triton_linear=triton_linear,
                                     triton_config=triton_config, slice=slice,
                                     pad_out=pad_out, acts=dict(acts or {}), torch_expert=torch_expert,
                                     torch_expert_impl=torch_expert_impl)


def weight_format(dtype: str):
    """The format of weight dtype ``dtype``; one that is not registered is refused in one line."""
    try:
        return FORMATS[dtype]
    except KeyError:
        raise RooflineError(f"no quantized weight format {dtype!r}: the registered ones are "
                            f"{', '.join(sorted(FORMATS))}.") from None


class _Stored:
    """What a quantized weight's stored tensors say of it: where it lives, and its activation dtype (its scales')."""

    @property
    def device(self):
        return self.qweight.device

    @property
    def act_dtype(self) -> torch.dtype:
        """The activation dtype: the scales' (int8 / int4), or ``act`` where the scales have their own type (FP4:
        e8m0 / e4m3 scales)."""
        return self.act if getattr(self, "act", None) is not None else self.scales.dtype


@dataclass(eq=False)
class QuantWeight(_Stored):
    """A weight-only quantized [K, N] weight, stored as its kernel reads it (see the module docstring)."""

    dtype: str                       # a FORMATS key: "int8" | "int4" | "fp8" | "fp8-tensor" | "fp8-block" | FP4's
    qweight: torch.Tensor            # int8 [N, K] | uint8 [N, K/2] (int4's packing; FP4 likewise) | e4m3 [N, K]
    scales: torch.Tensor             # int8: [N]; int4: [K/g, N]; in the activation dtype; FP4: [N, K/g] e8m0/e4m3;
    #                                  fp8: fp32 [N] | [1] | [cdiv(N, 128), cdiv(K, 128)]
    zeros: torch.Tensor | None       # int4 with zero points: [K/g, N]; else None
    in_features: int
    out_features: int
    group_size: int = 0              # int4: input rows per scale
    torch_impl: str = ""             # what the torch backend runs (prepare_torch); "" before
    torch_args: tuple = ()           # that op's prepared operands
    tensor_scale: torch.Tensor | None = None   # nvfp4: the fp32 per-tensor scale (ModelOpt's weight_scale_2), []
    act: torch.dtype | None = None   # FP4 (kernels.fp4): the activation dtype (its scales are e8m0 / e4m3)

    @property
    def shape(self) -> tuple:
        """The float weight's shape [K, N] (what the runners and the model read)."""
        return (self.in_features, self.out_features)

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        """The [K, N] weight these values stand for (the references' weight), in ``dtype``."""
        return weight_format(self.dtype).dequantize(self, dtype)


@dataclass(eq=False)
class QuantExperts(_Stored):
    """E experts' weights (a float [E, K, N] tensor's) quantized expert by expert and stacked, as the fused MoE
    kernels read them (``kernels.moe``); ``expert(e)`` is expert e as a ``QuantWeight`` (views, no copy)."""

    dtype: str                       # a FORMATS key, as QuantWeight's
    qweight: torch.Tensor            # int8 [E, N, K] | uint8 [E, N, K/2] | e4m3 [E, N, K]
    scales: torch.Tensor             # QuantWeight's with a leading E: int8 [E, N]; int4 [E, K/g, N]; FP4 [E, N, K/g];
    #                                  fp8 [E, N] | [E, 1] | [E, cdiv(N, 128), cdiv(K, 128)]
    zeros: torch.Tensor | None       # int4 with zero points: [E, K/g, N]; else None
    in_features: int
    out_features: int
    group_size: int = 0              # int4: input rows per scale
    views: tuple = ()                # the experts' QuantWeights (``expert``), built on first use
    tensor_scale: torch.Tensor | None = None   # nvfp4: fp32 [E], one per expert's tensor
    act: torch.dtype | None = None   # FP4 (kernels.fp4): the activation dtype

    @property
    def n_experts(self) -> int:
        return self.qweight.shape[0]

    @property
    def shape(self) -> tuple:
        """The float weights' shape [E, K, N] (what the MoE launchers and the runners read)."""
        return (self.n_experts, self.in_features, self.out_features)

    @property
    def torch_impl(self) -> str:
        """What the torch backend runs per expert: the format's ``torch_expert_impl``, else what ``prepare_torch``
        chose (the same for every expert)."""
        return weight_format(self.dtype).torch_expert_impl or (self.expert(0).torch_impl if self.n_experts else "")

    def expert(self, e: int) -> QuantWeight:
        """Expert ``e``'s [K, N] weight as a ``QuantWeight`` (views of the stacked tensors)."""
        if not self.views:
            z, ts = self.zeros, self.tensor_scale
            self.views = tuple(QuantWeight(self.dtype, self.qweight[i], self.scales[i], None if z is None else z[i],
                                           self.in_features, self.out_features, self.group_size,
                                           tensor_scale=None if ts is None else ts[i], act=self.act)
                               for i in range(self.n_experts))
        return self.views[e]

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        """The [E, K, N] weights these values stand for (the references' weights), in ``dtype``."""
        return torch.stack([self.expert(e).dequantize(dtype) for e in range(self.n_experts)])


TENSORS = ("qweight", "scales", "zeros", "tensor_scale")   # the stored tensors (a leading E on QuantExperts)


def remake(q, **changes):
    """A new ``QuantWeight`` / ``QuantExperts`` like ``q`` with ``changes`` (sizes, tensors); every stored tensor a
    contiguous copy (a shard outlives the full weight), nothing prepared for the torch backend."""
    names = {f.name for f in fields(q)}
    fresh = {"views": ()} if "views" in names else {"torch_impl": "", "torch_args": ()}
    tensors = {k: changes.get(k, getattr(q, k)) for k in TENSORS}
    tensors = {k: None if t is None else t.contiguous().clone() for k, t in tensors.items()}
    return replace(q, **{**changes, **fresh, **tensors})


def slice_experts(q: QuantExperts, start: int, stop: int) -> QuantExperts:
    """Experts ``start:stop`` of ``q`` (every stored tensor has a leading E): the same for every format."""
    return remake(q, **{k: getattr(q, k)[start:stop] for k in TENSORS if getattr(q, k) is not None})


def check_group(group_size) -> int:
    g = INT4_GROUP if group_size is None else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g not in INT4_GROUPS:
        raise RooflineError(f"the int4 group size must be one of {', '.join(map(str, INT4_GROUPS))}, but "
                            f"{group_size!r} was given.")
    return g


def aten():
    """torch.ops.aten (one place, so a test can take an op away)."""
    return torch.ops.aten


def op_missing(what: str, op: str, since: str) -> RooflineError:
    return RooflineError(f"{what} on the torch backend need torch.ops.aten.{op} (torch >= {since}), which torch "
                         f"{torch.__version__} lacks: use the triton backend, or int8 weights.")
