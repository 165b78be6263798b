"""`benchmarks/device_check.sh`, the one prepared GPU run, runs end to end on a CPU (`--quick`),
so it cannot rot between the rare GPU sessions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "device_check.sh"


def run_check(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_an_unknown_device_is_refused_in_one_line(tmp_path):
    result = run_check("--device", "tpu", out=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "device_check.sh: --device is 'tpu'; expected cpu or cuda"


@pytest.mark.slow
def test_the_quick_cpu_check_writes_commit_device_and_launches_per_step(tmp_path):
    result = run_check("--device", "cpu", "--quick", out=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "device_check_cpu.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", summary["commit"])
    assert summary["device"] and summary["torch"]
    assert summary["pytest_cuda"] == "skipped"
    assert set(summary["launches_per_step"]) == {f"{m}/w32/fp32/B{b}/off" for m in ("mlp", "char_gpt") for b in (1, 2)}
    assert all(count > 0 for count in summary["launches_per_step"].values())
    assert all(row["fused_step_ms"] > 0 and row["serial_step_ms"] > 0 for row in summary["rows"])
