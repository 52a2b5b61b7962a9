"""Issue 33: `ceilings --collective --tp N` with more CPU ranks than CPUs is refused, as `--threads` is."""

import os

import pytest
from click.testing import CliRunner

from profiler.cli import main
from profiler.distributed import check_cpu_ranks
from roofline.errors import RooflineError


def test_more_cpu_ranks_than_cpus_is_one_line_naming_the_count(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    res = CliRunner().invoke(main, ["ceilings", "--collective", "--tp", "64", "--device", "cpu"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == ["Error: --tp 64 starts 64 CPU ranks, but this machine has 2 logical CPU(s) (more ranks than "
                     "CPUs only wait on each other, for minutes): give --tp 2 or fewer."], res.output


def test_as_many_ranks_as_cpus_pass_and_gpus_are_not_judged_by_cpus(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert check_cpu_ranks(4, "cpu") == 4
    assert check_cpu_ranks(8, "cuda") == 8
    with pytest.raises(RooflineError, match="this machine has 4 logical CPU"):
        check_cpu_ranks(5, "cpu")


def test_profile_refuses_more_cpu_ranks_than_cpus_as_ceilings_does(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    res = CliRunner().invoke(main, ["profile", "--model", "tiny", "--tp", "4", "--device", "cpu", "--out",
                                    str(tmp_path / "o")])
    assert res.exit_code == 2 and res.output.strip() == (
        "Error: --tp 4 starts 4 CPU ranks, but this machine has 2 logical CPU(s) (more ranks than CPUs only wait "
        "on each other, for minutes): give --tp 2 or fewer.")
    assert not (tmp_path / "o").exists()
