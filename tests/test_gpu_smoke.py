"""The GPU smoke script (issue 69, docs/gpu.md) runs on the CPU as written: its cheap stages here, the rest where a
GPU is lent (the whole quick run takes minutes on two cores)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.fakes import ROOT


def test_the_smoke_script_runs_its_cheap_stages_on_the_cpu(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), "--device", "cpu", "--quick",
                          "--stages", "env,batch", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in lines] == ["[env", "[batch"]  # one line a stage, as it finishes
    records = [json.loads(line) for line in (tmp_path / "smoke.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["status"]) for r in records] == [("env", "ok"), ("batch", "ok")]
    assert records[0]["dtype_auto"] == "float32" and records[0]["cuda"] is None
    assert "equal their single runs" in records[1]["summary"] and records[1]["summary"].count(" yes") == 4
    assert (tmp_path / "smoke.md").is_file()


def test_an_unknown_stage_is_one_error_line(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), "--stages", "env,warp",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "unknown warp" in run.stderr
