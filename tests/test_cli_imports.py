"""The analytic commands stay light: ``roofline devices`` and ``roofline explain`` never import torch (its import
alone is seconds), so a laptop without a GPU answers them at once. Each runs in a fresh interpreter: this test
process has imported torch long before."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
from click.testing import CliRunner
from profiler.cli import main
codes = [CliRunner().invoke(main, args).exit_code for args in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules, "matplotlib": "matplotlib" in sys.modules}))
"""


def _after(*commands) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps([list(c) for c in commands])], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_explain_and_devices_do_not_import_torch():
    got = _after(("explain", "--model", "tiny", "--context", "128"),
                 ("explain", "--model", "tiny-moe", "--context", "128", "--json"),
                 ("explain", "linear", "--tokens", "16", "--in", "64", "--out", "64"), ("devices",), ("devices", "--json"))
    assert got["codes"] == [0, 0, 0, 0, 0]
    assert got["torch"] is False


def test_a_trace_without_its_report_does_not_import_matplotlib(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from engine_traces import BF, EngineTrace

    t = EngineTrace()
    t.op("aten::mm", [[8, 64], [64, 64]], [BF, BF], kernels=[("void gemv2T_kernel_val<bf16>", 5)])
    path = t.dump(tmp_path / "mm.json")
    got = _after(("trace", str(path), "--no-report", "--out", str(tmp_path / "out"), "--quiet"))
    assert got["codes"] == [0] and got["matplotlib"] is False and got["torch"] is False
