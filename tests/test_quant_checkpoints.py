"""Quantized checkpoints load into both backends (kernels.checkpoint + kernels.checkpoint_quant).

Each layout of tests/hf_tiny_quant.py is written by the test itself: the quantized folder and a float32 folder of
its exact dequantized weights. transformers 5.24 runs none of these layouts on this CPU (found: fp8 and mxfp4 need
accelerate, compressed-tensors its package, GPTQ optimum, and ModelOpt's NVFP4 ``weight`` [N, K/2] is read as a
float weight of the wrong shape), so the logits are checked against our model built from the dequantized float
weights, and that model against transformers on the same float folder:

- triton backend (TRITON_INTERPRET=1): every format runs as stored (``kernels.checkpoint.runs_as_stored``: a Triton
  linear for each, the fused MoE for mxfp4's experts), GPTQ as our int4; as on the torch backend:
- torch backend: every format runs as stored; nvfp4, mxfp4 (W4A16) and GPTQ within 1e-4; fp8 is W8A8 (the
  activations quantized to e4m3 per token / per 1 x 128 group, a relative step of 2^-4), so its logits are
  checked loosely (within 15% of the largest logit) and its weights exactly (each ``QuantWeight`` dequantizes to
  the dequantized folder's tensor bit for bit);
- bytes: every module's quantized tensors on disk, summed, equal ``Precision.weight_bytes`` over its ops (exact
  integers, static activation scales included: ModelOpt NVFP4's ``input_scale``, one fp32 per tensor, too).

Run: pytest tests/test_quant_checkpoints.py
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import hf_tiny as H  # noqa: E402
import hf_tiny_quant as Q  # noqa: E402
from kernels.model import LlamaModel  # noqa: E402
from kernels.quant_weight import QuantExperts, QuantWeight  # noqa: E402
from roofline.errors import RooflineError  # noqa: E402
from roofline.layer import model_ops, precision_of  # noqa: E402
from roofline.models import load_model  # noqa: E402
from roofline.precision.modules import WEIGHT_ROLES  # noqa: E402

ALL = tuple(Q.LAYOUTS) + ("mxfp4",)
TOKENS = [5, 9, 33, 100, 7, 8]
# layout -> (the format loaded, what our kernels hold on the torch backend, on the triton backend)
EXPECT = {"fp8-block": ("fp8-block", "fp8-block", "fp8-block"), "ct-fp8-channel": ("fp8", "fp8", "fp8"),
          "ct-fp8-tensor": ("fp8-tensor", "fp8-tensor", "fp8-tensor"), "nvfp4": ("nvfp4", "nvfp4", "nvfp4"),
          "gptq-sym": ("gptq-int4", "int4", "int4"), "gptq-asym": ("gptq-int4", "int4", "int4"),
          "mxfp4": ("mxfp4", "mxfp4", "mxfp4")}
W8A8 = ("fp8-block", "ct-fp8-channel", "ct-fp8-tensor")
_BUILT: dict = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    def get(layout):
        if layout not in _BUILT:
            _BUILT[layout] = Q.build(layout, tmp_path_factory.mktemp(layout))
        return _BUILT[layout]
    return get


def logits(folder, backend):
    with H.one_thread():
        m = LlamaModel(load_model(str(folder)), dtype="fp32", backend=backend)
        return m, m.prefill(torch.tensor(TOKENS), 0).numpy()


def quant_dtypes(m) -> set:
    return {v.dtype for lw in m.w["layers"] for v in lw.values() if isinstance(v, (QuantWeight, QuantExperts))}


@pytest.mark.parametrize("layout", ALL)
def test_logits_both_backends(built, layout):
    q, deq = built(layout)
    fmt, on_torch, on_triton = EXPECT[layout]
    _, ref = logits(deq, "torch")
    hf = H.prefill_logits(deq, TOKENS)[-1]
    assert np.abs(ref - hf).max() < 1e-4                     # the dequantized float model is transformers'
    m, y = logits(q, "triton")
    assert quant_dtypes(m) == {on_triton}
    assert np.abs(y - ref).max() < (0.15 * np.abs(ref).max() if layout in W8A8 else 1e-4)
    module = "experts" if layout == "mxfp4" else "attention"
    assert any(n.startswith(f"{module}: {fmt} checkpoint, run as stored ({on_triton} on the triton backend")
               for n in m.notes), m.notes
    m, y = logits(q, "torch")
    assert quant_dtypes(m) == {on_torch}
    assert any(n.startswith(f"{module}: {fmt} checkpoint, run as stored ({on_torch} on the torch backend")
               for n in m.notes)
    if layout in W8A8:
        assert np.abs(y - ref).max() < 0.15 * np.abs(ref).max()
        f, _ = logits(deq, "torch")
        for lw, fw in zip(m.w["layers"], f.w["layers"]):
            for k, v in lw.items():
                if isinstance(v, QuantWeight):
                    assert torch.equal(v.dequantize(torch.float32), fw[k]), k
    else:
        assert np.abs(y - ref).max() < 1e-4


STORED = ("weight_scale_inv", "weight_scale", "weight_scale_2", "input_scale", "qweight", "qzeros", "scales",
          "g_idx", "_blocks", "_scales")   # the tensors of a quantized weight beside its ``weight``


def disk_bytes(folder) -> dict:
    """Bytes of the quantized tensors on disk per module class, static activation scales included."""
    out = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            stored = k.endswith(STORED) or (k.endswith(".weight") and t.dtype != torch.float32)
            if not stored:
                continue
            m = "experts" if ".experts." in k else "attention" if "self_attn" in k else "mlp"
            out[m] = out.get(m, 0) + t.numel() * t.element_size()
    return out


def registry_bytes(folder) -> dict:
    cfg = load_model(str(folder))
    prec, out = precision_of(cfg), {}
    for o in model_ops(cfg):
        if not prec.quantized(o):
            continue
        for ws in o.weights:
            if ws.role in WEIGHT_ROLES:
                E, (K, N) = (ws.shape[0], ws.shape[1:]) if ws.role == "experts" else (1, ws.shape)
                out[o.module] = out.get(o.module, 0) + len(o.layers) * E * prec.weight_bytes(o, K, N, "fp32")
    return out


@pytest.mark.parametrize("layout", ALL)
def test_bytes_on_disk_equal_the_registry(built, layout):
    q, _ = built(layout)
    assert disk_bytes(q) == registry_bytes(q)


def test_bytes_pinned(built):
    # fp8-block, 2 layers: q_proj / o_proj 128 x 128 -> 16384 + 1 x 1 x 4; k / v 128 x 64 -> 8192 + 4;
    # attention = 2 * (2 * 16388 + 2 * 8196) = 98336. mlp: gate / up 128 x 256 -> 32768 + 1 x 2 x 4, down
    # 256 x 128 -> 32768 + 2 x 1 x 4: 2 * 3 * 32776 = 196656.
    assert disk_bytes(built("fp8-block")[0]) == {"attention": 98336, "mlp": 196656}
    # gptq g128: q_proj 128 x 128 -> qweight 16 x 128 x 4 = 8192, qzeros 1 x 16 x 4 = 64, scales 1 x 128 x 2 = 256,
    # g_idx 128 x 4 = 512: 9024; k / v (N 64): 4096 + 32 + 128 + 512 = 4768; attention 2 * (2 * 9024 + 2 * 4768).
    assert disk_bytes(built("gptq-asym")[0])["attention"] == 2 * (2 * 9024 + 2 * 4768)


def _rewrite(folder, dest, edit):
    dest.mkdir()
    (dest / "config.json").write_text((folder / "config.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    edit(sd)
    save_file(sd, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def test_refusals_name_the_tensor_and_file(built, tmp_path):
    q, _ = built("fp8-block")
    name = "model.layers.1.self_attn.k_proj.weight_scale_inv"
    gone = _rewrite(q, tmp_path / "gone", lambda sd: sd.pop(name))
    with pytest.raises(RooflineError, match=f"lacks the tensor '{name}' that the fp8-block layout"):
        LlamaModel(load_model(str(gone)), dtype="fp32", backend="torch")
    bad = _rewrite(q, tmp_path / "bad", lambda sd: sd.__setitem__(name, torch.ones(2, 1)))
    with pytest.raises(RooflineError, match=rf"'{name}' in model.safetensors has shape \[2, 1\] where the fp8-block "
                                            r"layout stores \[1, 1\]"):
        LlamaModel(load_model(str(bad)), dtype="fp32", backend="torch")
    g, _ = built("gptq-sym")
    gi = "model.layers.0.mlp.down_proj.g_idx"
    perm = _rewrite(g, tmp_path / "perm", lambda sd: sd.__setitem__(gi, sd[gi].flip(0).contiguous()))
    with pytest.raises(RooflineError, match=r"g_idx is not k // 128 \(desc_act true"):
        LlamaModel(load_model(str(perm)), dtype="fp32", backend="triton")


def test_config_records_the_checkpoint_precision(built):
    q, _ = built("fp8-block")
    cfg = load_model(str(q))
    assert cfg.quantization.method == "fp8"
    assert json.loads(cfg.quantization.raw)["weight_block_size"] == [128, 128]
    assert cfg.to_dict()["quantization"]["config"]["quant_method"] == "fp8"


def test_a_layout_without_a_reader_is_refused(built, tmp_path):
    q, _ = built("fp8-block")
    dest = _rewrite(q, tmp_path / "ct-block", lambda sd: None)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                                 "block_structure": [128, 128]}}}, "ignore": ["lm_head"]}
    (dest / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RooflineError, match=r"compressed-tensors weights in fp8 e4m3 \(128x128 blocks\) "
                                            r"\(model.layers.0.self_attn.q_proj.weight\) have no reader \(read: fp8 "):
        LlamaModel(load_model(str(dest)), dtype="fp32", backend="torch")


def test_runs_as_stored_follows_the_registry_and_the_device(monkeypatch):
    """The triton backend runs every format with a Triton linear as stored, routed experts in those the fused MoE
    takes (int8, int4, fp8 x3, mxfp4, nvfp4), except fp8's W8A8 linear on a GPU before sm_89 (its activations are
    quantized for fp8 tensor cores); the torch backend every registered format; no backend none."""
    from kernels.checkpoint import runs_as_stored
    from kernels.quant_weight import FORMATS

    for d in FORMATS:
        assert runs_as_stored("triton", d) and runs_as_stored("triton", d, "experts") and runs_as_stored("torch", d)
        assert runs_as_stored("triton", d, "linear", "cpu") and not runs_as_stored(None, d)
    assert not runs_as_stored("triton", "gptq-int4") and not runs_as_stored("torch", "awq-int4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    assert not runs_as_stored("triton", "fp8-block", "linear", "cuda")          # sm_80: dequantized at load
    assert runs_as_stored("triton", "fp8-block", "experts", "cuda")             # weight-only: e4m3 decoded as ints
    assert runs_as_stored("triton", "mxfp4", "linear", "cuda") and runs_as_stored("torch", "fp8", "linear", "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    assert runs_as_stored("triton", "fp8-block", "linear", "cuda")
