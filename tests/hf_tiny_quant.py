"""Tiny quantized checkpoints, one per stored layout, written here from a float checkpoint that transformers' own
``save_pretrained`` saved (``LAYOUTS``: name -> (quantization_config, writer)).

``build(layout, folder)`` saves a float32 tiny Llama (hidden 128, MLP 256: every in-features a multiple of 128, so
128 x 128 FP8 blocks, GPTQ's group 128, NVFP4's 16 all fit), re-stores every decoder Linear (q/k/v/o, gate/up/down;
lm_head, the norms and the embedding stay float32, as the published checkpoints keep them) in the layout, and
writes config.json with the matching ``quantization_config``. ``dequantized(layout, folder)`` writes the same
model as a float32 checkpoint of the exact dequantized weights (our model built from it is the reference where
transformers cannot run the layout on a CPU). ``mxfp4`` is gpt-oss (tests/hf_tiny_moe.py's tiny config), its
experts' gate_up_proj / down_proj in ``*_blocks`` / ``*_scales``.

The layouts: ``fp8-block`` (quant_method fp8: ``weight`` e4m3, ``weight_scale_inv`` per 128 x 128),
``ct-fp8-channel`` / ``ct-fp8-tensor`` (compressed-tensors: ``weight_scale`` [N, 1] / [1], the tensor one with a
static ``input_scale``), ``nvfp4`` (ModelOpt: ``weight`` uint8, ``weight_scale`` e4m3 per 16, ``weight_scale_2``,
``input_scale``), ``gptq-sym`` / ``gptq-asym`` (``qweight`` / ``qzeros`` / fp16 ``scales`` / ``g_idx``, g 128,
desc_act false), ``mxfp4`` (gpt-oss).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import hf_tiny as H  # noqa: E402
import hf_tiny_moe as HM  # noqa: E402
from kernels import fp4, linear_fp8  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GPTQ_GROUP = 128


def tiny_llama():
    """The float32 tiny Llama config (module docstring)."""
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=256,
                                   rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)
    setattr(cfg, "dtype", torch.float32)
    return cfg


def build_float(folder, seed: int = 0) -> Path:
    """The float32 tiny Llama, weights N(0, 0.1) (norms U(0.6, 1.4)), saved by transformers."""
    folder = Path(folder)
    with H.one_thread():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(tiny_llama(), attn_implementation="eager").float().eval()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(0.6 + 0.8 * torch.rand(p.shape, generator=g) if "norm" in name else
                        torch.randn(p.shape, generator=g) * 0.1)
        model.save_pretrained(folder, safe_serialization=True)
    return folder


def _int32(x: torch.Tensor) -> torch.Tensor:
    """int64 holding 32 unsigned bits -> the int32 with those bits."""
    return (((x + 2 ** 31) % 2 ** 32) - 2 ** 31).to(torch.int32)


def pack_int32(v: torch.Tensor, dim: int) -> torch.Tensor:
    """int4 values (0..15, int64) packed 8 per int32 along ``dim`` (value j of 8 in bits 4j..4j+3)."""
    v = v if dim == 1 else v.t()
    v = v.reshape(v.shape[0], -1, 8) << torch.arange(0, 32, 4)
    out = _int32(v.sum(-1))
    return out if dim == 1 else out.t().contiguous()


def gptq(W: torch.Tensor, sym: bool) -> dict:
    """A [N, K] float weight in GPTQ's layout (g 128, v1: qzeros store z - 1): fp16 scales, w ~ (q - z) * s."""
    N, K = W.shape
    wg = W.t().reshape(K // GPTQ_GROUP, GPTQ_GROUP, N).double()                 # [K/g, g, N]
    if sym:
        s = (wg.abs().amax(1) / 7).half()
        z = torch.full(s.shape, 8, dtype=torch.int64)
    else:
        lo, hi = wg.amin(1), wg.amax(1)
        s = ((hi - lo) / 15).half()
        z = torch.round(-lo / s.double()).clamp(0, 15).long()
    q = torch.round(wg / s.double()[:, None] + z[:, None]).clamp(0, 15).long().reshape(K, N)
    zk, sk = z.repeat_interleave(GPTQ_GROUP, 0), s.double().repeat_interleave(GPTQ_GROUP, 0)     # [K, N]
    return {"qweight": pack_int32(q, 0), "qzeros": pack_int32((z - 1) & 0xF, 1), "scales": s.contiguous(),
            "g_idx": (torch.arange(K) // GPTQ_GROUP).to(torch.int32)}, ((q - zk).double() * sk).t()


def fp8(W: torch.Tensor, fmt: str) -> dict:
    qw = linear_fp8.quantize(W.t(), fmt)
    exact = linear_fp8.dequantize(qw, torch.float64).t()
    if fmt == "fp8-block":
        return {"weight": qw.qweight, "weight_scale_inv": qw.scales}, exact
    scale = qw.scales.reshape(-1, 1) if fmt == "fp8" else qw.scales
    out = {"weight": qw.qweight, "weight_scale": scale}
    if fmt == "fp8-tensor":
        out["input_scale"] = torch.tensor([0.02], dtype=torch.float32)
    return out, exact


def nvfp4(W: torch.Tensor) -> dict:
    qw = fp4.quantize(W.t(), "nvfp4")
    return {"weight": qw.qweight, "weight_scale": qw.scales, "weight_scale_2": qw.tensor_scale.reshape(()),
            "input_scale": torch.tensor(0.02, dtype=torch.float32)}, fp4.dequantize(qw, torch.float64).t()


_CT = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
       "ignore": ["lm_head"]}
LAYOUTS = {
    "fp8-block": ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                   "weight_block_size": [128, 128]}, lambda W: fp8(W, "fp8-block")),
    "ct-fp8-channel": ({**_CT, "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}},
        lambda W: fp8(W, "fp8")),
    "ct-fp8-tensor": ({**_CT, "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}}}},
        lambda W: fp8(W, "fp8-tensor")),
    "nvfp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]},
              nvfp4),
    "gptq-sym": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
                  "checkpoint_format": "gptq"}, lambda W: gptq(W, True)),
    "gptq-asym": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": False,
                   "checkpoint_format": "gptq"}, lambda W: gptq(W, False)),
}
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}


def _write(folder: Path, tensors: dict, qconfig: dict, base: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((base / "config.json").read_text())
    if qconfig is not None:
        cfg["quantization_config"] = qconfig
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    safetensors_torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
                                metadata={"format": "pt"})
    return folder


def _float_state(base: Path) -> dict:
    return safetensors_torch.load_file(str(base / "model.safetensors"))


def build(layout: str, folder) -> tuple:
    """(the tiny checkpoint in ``layout``, the float32 checkpoint of its exact dequantized weights), written under
    ``folder`` (the float original in ``folder``/float)."""
    folder = Path(folder)
    out, deq = {}, {}
    if layout == "mxfp4":
        base, qconfig = HM.build_checkpoint("gpt_oss", folder / "float"), MXFP4
        for k, v in _float_state(base).items():
            deq[k] = out[k] = v
            if k.endswith(("experts.gate_up_proj", "experts.down_proj")):          # [E, K, N] float
                q = fp4.quantize_experts(v, "mxfp4")
                E, N = q.qweight.shape[:2]
                del out[k]
                out[f"{k}_blocks"] = q.qweight.reshape(E, N, -1, 16)
                out[f"{k}_scales"] = q.scales
                deq[k] = q.dequantize(torch.float64)
    else:
        base = build_float(folder / "float")
        qconfig, write = LAYOUTS[layout]
        for k, v in _float_state(base).items():
            mod = k.removesuffix(".weight")
            deq[k] = out[k] = v
            if k.endswith(".weight") and mod.rsplit(".", 1)[-1] in LINEARS:
                del out[k]
                stored, deq[k] = write(v)
                out.update({f"{mod}.{n}": t for n, t in stored.items()})
    q = _write(folder / layout, out, qconfig, base)
    return q, _write(folder / (layout + "-dequantized"), deq, None, base)
