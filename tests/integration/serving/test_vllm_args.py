"""A launch through ServerProcess with a stand-in `vllm` executable that records what it was given: the rendered
command reaches vLLM whole. The rendering itself is tests/unit/serving/test_vllm_args.py's."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from draftsync.serving.process import ServerProcess, free_port
from draftsync.serving.vllm_args import SpeculationSpec, render_vllm_command

STAND_IN_VLLM = """\
#!{python}
# A stand-in for the vllm executable: records its argv, then answers /health on --host/--port until stopped.
import http.server, json, os, sys

with open(os.environ["VLLM_ARGV_RECORD"], "w") as record:
    json.dump(sys.argv, record)
host = sys.argv[sys.argv.index("--host") + 1]
port = int(sys.argv[sys.argv.index("--port") + 1])


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer((host, port), Health).serve_forever()
"""


def test_the_launch_reaches_vllm_as_rendered(tmp_path):
    """Through ServerProcess, with no shell in between: every argument arrives whole, the JSON intact."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "vllm"
    stand_in.write_text(STAND_IN_VLLM.format(python=sys.executable))
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    marker = tmp_path / "shell-ran"
    target = tmp_path / f"tar get $(touch {marker}) ;x"
    drafter = tmp_path / f"dr'af\"ter `touch {marker}`"
    port = free_port()
    launch = render_vllm_command(
        target,
        port=port,
        served_model_name="pair",
        speculation=SpeculationSpec(
            method="eagle3.1", model=drafter, num_speculative_tokens=4, schedule=[(1, 8, 4), (9, 32, 2)]
        ),
        tensor_parallel_size=2,
        extra_args=["--max-model-len", "512", "--override-generation-config", '{"temperature": 0}'],
    )
    record = tmp_path / "argv.json"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "VLLM_ARGV_RECORD": str(record)}
    with ServerProcess(launch.argv, "127.0.0.1", port, tmp_path / "vllm.log", env=env) as server:
        server.wait_healthy(timeout=60)
        recorded = json.loads(record.read_text())
    assert Path(recorded[0]) == stand_in
    assert recorded[1:] == launch.argv[1:]
    assert json.loads(recorded[recorded.index("--speculative-config") + 1]) == launch.speculative_config
    assert launch.speculative_config["model"] == str(drafter)
    assert not marker.exists()
