"""`make gpu-check` runs where only torch and transformers are installed: its script is run here at toy shapes on
the CPU with vLLM, Prefect, MLflow and pydantic made unimportable, as on the GPU machine it is written for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WITHOUT_THE_STACK = """
import runpy, sys
for name in ("vllm", "prefect", "mlflow", "pydantic", "pydantic_settings", "sqlalchemy"):
    sys.modules[name] = None
sys.argv = ["gpu_check.py", "--tiny", "--steps", "30"]
runpy.run_path("bench/gpu_check.py", run_name="__main__")
"""


def test_the_gpu_check_trains_through_the_syncs_step_with_only_torch_and_transformers():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_STACK], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["device"] == "cpu" and result["steps"] == 30 and result["micro_batches_per_step"] == 2
    assert result["loss_last"] < result["loss_first"]  # the drafter learns the target's (random) distribution
    assert result["predicted_step_gib"] > 0 and result["train_tokens_per_s"] > 0
