"""Trace cost rules as a registry (roofline.traces.registry): a rule added from a test file, or loaded from a user's
file, costs a trace's op and names its kernels, with no package file touched; a broken file is one line."""

import json

import pytest

from roofline.cost import Cost
from roofline.errors import RooflineError
from roofline.traces import registry
from roofline.traces.analyze import analyze_trace
from roofline.traces.cost import categories, cost_op
from roofline.traces.events import read_trace
from roofline.traces.graphs import kernel_category
from roofline.traces.opcost import numel, signature
from roofline.traces.registry import load_rules, rule

F32 = "float"


@rule(pattern=r"^toyco::frobnicate", kernels=r"frobnicate_kernel", category="toy-frobnication")
def frobnicate(a):
    """3 FLOPs per element of the input, read once and written once in its dtype (fp32: 4 bytes)."""
    (shape, dt), = a.tensors()
    return a.op(Cost(3 * numel(shape), 2 * 4 * numel(shape)), dt, signature(shape, dtype=dt))


def _trace(tmp_path, toy_name):
    """A GPU trace: aten::mm (its kernel 20 us) and the toy op (its kernel 60 us), each launched by its op."""
    ev, corr = [], 100
    for i, (name, dims, kernel, dur) in enumerate([("aten::mm", [[8, 64], [64, 64]], "ampere_sgemm_64x64_nn", 20),
                                                   (toy_name, [[4, 8]], "void frobnicate_kernel<4>", 60)]):
        t, corr = 100 * i, corr + 1
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": 50,
                   "args": {"External id": i + 1, "Input Dims": dims, "Input type": [F32] * len(dims),
                            "Concrete Inputs": [""] * len(dims)}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 10,
                   "dur": 5, "args": {"correlation": corr, "External id": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": 1000 + 100 * i, "dur": dur,
                   "args": {"device": 0, "stream": 7, "correlation": corr, "External id": i + 1}})
    p = tmp_path / f"{toy_name.replace(':', '_')}.json"
    p.write_text(json.dumps({"schemaVersion": 1, "record_shapes": 1, "traceEvents": ev,
                             "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    return read_trace(p)


def _costed_share(s):
    return s["costed_s"] / s["attributed_s"]


def test_a_toy_rule_from_a_test_file_costs_the_op_and_raises_the_costed_share_by_its_time(tmp_path):
    without = analyze_trace(_trace(tmp_path, "toyco::unknown")).summary     # no rule matches: uncosted
    assert without["uncosted_s"] == pytest.approx(60e-6, rel=1e-12)
    assert _costed_share(without) == pytest.approx(20 / 80, rel=1e-12)
    res = analyze_trace(_trace(tmp_path, "toyco::frobnicate"))
    s = res.summary
    assert s["uncosted_s"] == 0 and s["costed_s"] == pytest.approx(80e-6, rel=1e-12)
    assert _costed_share(s) - _costed_share(without) == pytest.approx(60 / 80, rel=1e-12)   # exactly the toy op's
    assert s["by_category_s"]["toy-frobnication"] == pytest.approx(60e-6, rel=1e-12)
    toy, = [m for m in res.measurements if m.config["name"] == "toyco::frobnicate"]
    assert toy.point.cost == Cost(96, 256) and toy.config["category"] == "toy-frobnication"
    assert toy.config["signature"] == "[4,8] fp32" and toy.point.compute_dtype == "fp32"


def test_the_toy_category_is_in_the_derived_list_and_names_its_kernels():
    cats = categories()
    assert "toy-frobnication" in cats and len(cats) == len(set(cats))
    assert cats[:4] == registry.NON_RULE_CATEGORIES and {"gemm", "attention", "communication"} <= set(cats)
    assert kernel_category("void frobnicate_kernel<4>") == "toy-frobnication"
    assert kernel_category("ampere_sgemm_64x64_nn") == "gemm" and kernel_category("mystery") == "other"


def test_match_order_exact_names_first_then_patterns_by_priority():
    args = {"Input Dims": [[4, 8]], "Input type": [F32], "Concrete Inputs": [""]}
    assert cost_op("toyco::frobnicate_more", args).category == "toy-frobnication"
    assert cost_op("aten::frobnicate", args) is None                   # the toy pattern is anchored at toyco::
    assert registry.rule_for("aten::mm").label.endswith("rules.aten.mm")  # an exact name before any pattern
    # a custom op pattern skips aten's own ops: _fused_rms_norm_backward is not an RMSNorm forward
    assert registry.rule_for("aten::_fused_rms_norm_backward") is None
    assert registry.rule_for("_C::fused_add_rms_norm").categories == ("norm",)


def test_a_rule_file_loaded_with_load_rules_costs_its_ops(tmp_path):
    f = tmp_path / "my_rules.py"
    f.write_text("from roofline.cost import Cost\n"
                 "from roofline.traces.registry import rule\n\n"
                 "@rule(names=('widgetco::spin',), category='toy-spin', tensor_cores=True)\n"
                 "def spin(a):\n"
                 "    (shape, dt), = a.tensors()\n"
                 "    return a.op(Cost(7, 11), dt, 'spun')\n")
    args = {"Input Dims": [[2, 2]], "Input type": ["c10::BFloat16"], "Concrete Inputs": [""]}
    assert cost_op("widgetco::spin", args) is None
    added = load_rules(f)
    assert [r.categories for r in added] == [("toy-spin",)]
    c = cost_op("widgetco::spin", args)
    assert (c.cost, c.category, c.signature, c.compute_dtype) == (Cost(7, 11), "toy-spin", "spun", "bf16")
    assert "toy-spin" in categories()


@pytest.mark.parametrize("write, words", [
    (None, "does not exist"),
    (lambda p: p.with_suffix(".txt").write_text("x = 1\n"), "is not a Python file (.py)"),
    (lambda p: p.write_text("from roofline.traces.registry import rule\n\n"
                            "@rule(names=('brokenco::a',), category='toy-broken')\n"
                            "def a(x):\n    return None\n\n"
                            "raise KeyError('no such table')\n"), "failed on import: KeyError: 'no such table'."),
    (lambda p: p.write_text("def oops(:\n"), "failed on import: SyntaxError"),
    (lambda p: p.write_text("from roofline.traces.registry import rule\n\n"
                            "@rule(names=('brokenco::b',), category='')\n"
                            "def b(x):\n    return None\n"), "must declare a category"),
])
def test_a_broken_rule_file_is_refused_in_one_line_naming_it(tmp_path, write, words):
    p = tmp_path / "bad_rules.py"
    if write is not None:
        write(p)
    target = p.with_suffix(".txt") if words.startswith("is not a Python") else p
    n = len(registry.RULES)
    with pytest.raises(RooflineError) as e:
        load_rules(target)
    msg = str(e.value)
    assert "\n" not in msg and str(target) in msg and words in msg
    assert len(registry.RULES) == n and registry.rule_for("brokenco::a") is None   # a failed file adds no rule
