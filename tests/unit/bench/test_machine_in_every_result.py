"""Every benchmark's JSON names the machine it ran on: results go out through harness.emit_json, which adds the CPU."""

from __future__ import annotations

import io
import json
from pathlib import Path

from bench.harness import emit_json

BENCH = Path(__file__).resolve().parents[3] / "bench"


def test_emit_json_adds_the_cpu_beside_what_the_benchmark_recorded(tmp_path):
    out_file = tmp_path / "deep" / "result.json"
    stdout = io.StringIO()
    emit_json({"figure": 1.5, "machine": {"load_average_1min": {"start": 0.1}}}, out_file, stdout)
    printed = json.loads(stdout.getvalue())
    assert printed == json.loads(out_file.read_text())
    machine = printed["machine"]
    assert machine["load_average_1min"] == {"start": 0.1} and printed["figure"] == 1.5
    assert machine["cpu_model"] and machine["cores"] >= 1 and isinstance(machine["vector_extensions"], list)


def test_every_benchmark_script_writes_its_result_through_emit_json():
    scripts = [p for p in BENCH.glob("*.py") if "__main__" in p.read_text() and p.name != "harness.py"]
    assert len(scripts) >= 10, scripts
    for script in scripts:
        text = script.read_text()
        assert "emit_json(" in text, (
            f"{script.name} prints its result without harness.emit_json: its JSON would not name the machine"
        )
