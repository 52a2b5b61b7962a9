"""``roofline check`` through click: exit codes and the printed numbers."""

import json

from click.testing import CliRunner

from profiler.cli import main


def test_check_json_torch_backend():
    res = CliRunner().invoke(main, ["check", "--backend", "torch", "--dtype", "fp32", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    # float kernels and model; bias, geglu, window, softcap; MLA; MoE (3 route, 5 moe_experts); the quantized ones
    # (no fp8 KV append without a GPU): 26, plus 5 quantized-expert rows and 2 of an 8-bit KV cache with sinks;
    # FP8 (issue 29): 18 W8A8 GEMMs (3 scale layouts x 3 shapes x 2 outputs), 6 act quants, 6 fp8 experts (3 layouts
    # x 2 shapes), 10 fp8-KV attentions; FP4: 6 linears and 4 experts (mxfp4, nvfp4); issue 31: 2 more routes
    # (Llama-4's sigmoid_topk, ERNIE's softmax_topk + bias) and 3 chunked attentions (Llama-4: 2 prefill, 1 decode);
    # the verify step (issue 34): 5 float rows and 1 over an int8 cache; issue 32: Mamba-2 13 rows, Gated DeltaNet
    # 16 (the chunked rule and its state x 3, the decode step and its state, 2 convs and their states, 2 gates, the
    # gated norm, the output gate), DSA 4 (k_norm, scores, top-k, the sparse decode), Nemotron-H's relu2 3 (the
    # activation, ungated relu2 experts with and without biases)
    assert len(rows) == (22 + 11 + 5 + 8 + 26 + 5 + 2 + (18 + 6 + 6 + 10) + (6 + 4) + (2 + 3) + (5 + 1) + 13 + 16 + 4
                         + 3)
    names = [r["name"] for r in rows]
    assert sum(n.startswith("route ") for n in names) == 5 and sum(" chunk=" in n and n.endswith("_attn", 0, n.index(" ")) for n in names) == 3
    assert sum(n.startswith("moe_experts int") for n in names) == 5 and sum("KV +sinks" in n for n in names) == 2
    assert sum("int8" in r["name"] or "int4" in r["name"] for r in rows) == 26 + 5 + 2 + 1
    assert sum(n.startswith("verify_attn") for n in names) == 5 + 1
    assert all(r["passed"] and r["max_rel_err"] <= r["tol"] for r in rows)
    assert rows[0]["name"].startswith("linear") and rows[0]["tol"] == 1e-5


def test_check_bad_dtype_runs_nothing():
    res = CliRunner().invoke(main, ["check", "--dtype", "int4"])
    assert res.exit_code == 2
    assert "'int4' is not one of 'fp32', 'fp16', 'bf16'" in res.output
