"""`make gpu-check` runs where only torch and transformers are installed: its script is run here at toy shapes on
the CPU with vLLM, Prefect, MLflow, SQLAlchemy and pydantic made unimportable, in it and in the torchrun ranks it
starts, as on the GPU machine it is written for."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
STACK = ("vllm", "prefect", "mlflow", "pydantic", "pydantic_settings", "sqlalchemy")
STEPS = 8


def without_the_stack(directory: Path) -> dict[str, str]:
    """An environment whose Python processes, children included, cannot import the stack (a sitecustomize)."""
    (directory / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({STACK!r}))\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))}


def test_the_gpu_check_runs_the_syncs_training_with_only_torch_and_transformers(tmp_path):
    env = without_the_stack(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import pydantic"], env=env, capture_output=True, check=False)
    assert probe.returncode != 0  # the stack is really out of reach

    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--tiny", "--steps", str(STEPS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["device"] == "cpu" and result["target"]["devices"] == ["cpu"]
    assert result["target"]["dtype"] == "torch.float32"  # TargetPlacement() on a CPU
    for phase in ("offline", "resume", "online"):
        figures = result[phase]
        assert figures["target_stays_placed"] is True and figures["drafter_owns_its_tensors"] is True, phase
        assert math.isfinite(figures["loss_last"]) and figures["tokens_per_s"] > 0, phase
    assert result["offline"]["steps"] == STEPS and result["offline"]["loss_last"] < result["offline"]["loss_first"]
    assert result["offline"]["predicted_step_gib"] > 0
    assert result["resume"]["resumed_from_step"] == STEPS and result["resume"]["steps"] == 2 * STEPS
    assert result["online"]["steps"] == STEPS and result["online"]["loss_last"] < result["online"]["loss_first"]

    ranks = result["ranks"]
    assert ranks["world_size"] == 2 and ranks["fresh"]["steps"] == STEPS
    assert ranks["resumed"]["resumed_from_step"] == STEPS and ranks["resumed"]["steps"] == 2 * STEPS
    assert ranks["resumed"]["resumed_world_size"] == 1  # the one-process checkpoint resumes on two ranks
