"""The speculators training backend: rendered commands, argument lists kept whole, and the job runner.

Whether speculators itself accepts the rendered flags is checked by `make compat` (its own parsers and a
real `speculators train --dry-run`); here the commands are pinned exactly and the runner is exercised
with stand-in executables for vllm, speculators and torchrun.
"""

from __future__ import annotations

import json
import socket
import sys
import textwrap
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.speculative.train.speculators import (
    SpeculatorsTrainJob,
    check_installed,
    hidden_state_server_command,
    render_commands,
    run_commands,
    run_job,
    train_command,
    write_token_rows,
)


def write_target(directory: Path, layers: int = 8) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers}))
    return str(directory)


def test_single_gpu_eagle3_renders_speculators_train(tmp_path):
    target = write_target(tmp_path / "target")
    job = SpeculatorsTrainJob(
        target=target, data=("/data/rows.jsonl",), work_dir="/w", output_dir="/out", draft_vocab_size=32000, epochs=2
    )
    assert render_commands(job) == [
        [
            "speculators",
            "prepare-data",
            "--model",
            target,
            "--data",
            "/data/rows.jsonl",
            "--output",
            "/w/prepared",
            "--seq-length",
            "8192",
            "--seed",
            "0",
            "--no-skip-token-freq",
        ],
        [
            "speculators",
            "generate-offline-data",
            "--model",
            target,
            "--endpoint",
            "http://127.0.0.1:8000/v1",
            "--preprocessed-data",
            "/w/prepared",
            "--validate-outputs",
        ],
        [
            "speculators",
            "train",
            "--verifier-name-or-path",
            target,
            "--speculator-type",
            "eagle3",
            "--data-path",
            "/w/prepared",
            "--save-path",
            "/out",
            "--num-layers",
            "1",
            "--draft-arch",
            "llama",
            "--full-attention-indices",
            "0",
            "--target-layer-ids",
            "2",
            "4",
            "5",
            "--norm-before-residual",
            "--no-norm-before-fc",
            "--no-norm-output",
            "--draft-vocab-size",
            "32000",
            "--ttt-steps",
            "3",
            "--epochs",
            "2",
            "--lr",
            "0.001",
            "--total-seq-len",
            "8192",
            "--on-missing",
            "raise",
            "--seed",
            "0",
        ],
    ]


def test_eight_gpus_eagle3_1_renders_torchrun_with_the_eagle3_1_norms():
    job = SpeculatorsTrainJob(
        target="org/model",
        data=("/d",),
        work_dir="/w",
        output_dir="/out",
        method="eagle3.1",
        aux_layer_ids=(2, 16, 29),
        target_num_layers=32,
        gpus_per_node=8,
        lr=2e-4,
        ttt_steps=2,
        norm_before_residual=False,
        extra_train_args=("--logger", "mlflow"),
    )
    assert train_command(job) == [
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "8",
        "-m",
        "speculators.train",
        "--verifier-name-or-path",
        "org/model",
        "--speculator-type",
        "eagle3",
        "--data-path",
        "/w/prepared",
        "--save-path",
        "/out",
        "--num-layers",
        "1",
        "--draft-arch",
        "llama",
        "--full-attention-indices",
        "0",
        "--target-layer-ids",
        "2",
        "16",
        "29",
        "--no-norm-before-residual",
        "--fc-norm",
        "--no-norm-before-fc",
        "--norm-output",
        "--ttt-steps",
        "2",
        "--epochs",
        "20",
        "--lr",
        "0.0002",
        "--total-seq-len",
        "8192",
        "--on-missing",
        "raise",
        "--seed",
        "0",
        "--logger",
        "mlflow",
    ]


def test_multi_node_warm_start_uses_c10d_rendezvous_and_no_shaping_flags():
    job = SpeculatorsTrainJob(
        target="org/model",
        data=("/chats",),
        work_dir="/w",
        output_dir="/out",
        aux_layer_ids=(2, 16, 29),
        target_num_layers=32,
        gpus_per_node=8,
        nnodes=2,
        rdzv_endpoint="node0:29400",
        from_pretrained="/drafters/v1",
        conversations=True,
    )
    command = train_command(job)
    assert command[:12] == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "node0:29400",
        "--rdzv-id",
        "draftsync",
        "-m",
    ]
    assert command[command.index("--from-pretrained") + 1] == "/drafters/v1"
    assert "--num-layers" not in command and "--full-attention-indices" not in command
    prepare = render_commands(job)[0]
    assert prepare[-2:] == ["--render-endpoint", "http://127.0.0.1:8000"] and "--no-skip-token-freq" not in prepare


def test_hidden_state_server_extracts_the_aux_layers_and_the_last(tmp_path):
    job = SpeculatorsTrainJob(
        target=write_target(tmp_path / "t", layers=8),
        data=("/d",),
        work_dir="/w",
        output_dir="/o",
        vllm_port=8123,
        vllm_tensor_parallel_size=2,
    )
    command = hidden_state_server_command(job)
    assert command[:11] == [
        "vllm",
        "serve",
        job.target,
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tensor-parallel-size",
        "2",
        "--data-parallel-size",
        "1",
    ]
    speculative = json.loads(command[command.index("--speculative-config") + 1])
    assert speculative == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5, 8]}},
    }
    transfer = json.loads(command[command.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "DraftsyncHiddenStatesConnector"  # vLLM's, made to run on its CPU build too
    assert transfer["kv_connector_module_path"] == "draftsync_hidden_states"
    assert transfer["kv_connector_extra_config"] == {"shared_storage_path": "/w/vllm-hidden-states"}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"method": "medusa"}, "medusa"),
        ({"nnodes": 2}, "rdzv_endpoint"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"aux_layer_ids": (1, 1, 2)}, "aux layer ids"),
        ({"data": ()}, "no data"),
    ],
)
def test_bad_jobs_are_refused_naming_the_field(options, named):
    fields = {"target": "org/model", "data": ("/d",), "work_dir": "/w", "output_dir": "/o", **options}
    with pytest.raises(DraftsyncError, match=named):
        SpeculatorsTrainJob(**fields)


def test_aux_layer_beyond_the_target_and_unknown_layer_count_are_refused(tmp_path):
    job = SpeculatorsTrainJob(
        target=write_target(tmp_path / "t", layers=4),
        data=("/d",),
        work_dir="/w",
        output_dir="/o",
        aux_layer_ids=(1, 2, 9),
    )
    with pytest.raises(DraftsyncError, match=r"\[1, 2, 9\]"):
        train_command(job)
    hub = SpeculatorsTrainJob(target="org/model", data=("/d",), work_dir="/w", output_dir="/o")
    with pytest.raises(DraftsyncError, match="target_num_layers"):
        train_command(hub)


ECHO_ARGV = f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"


def stand_in(directory: Path, name: str, source: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(source)
    path.chmod(0o755)
    return path


def test_shell_metacharacters_in_paths_stay_single_arguments(tmp_path):
    odd = "/data/my rows; rm -rf ~ && echo $(whoami) `id` 'q' \"dq\" > out | cat *.jsonl"
    job = SpeculatorsTrainJob(
        target="org/model",
        data=(odd,),
        work_dir=odd,
        output_dir=odd + " out",
        aux_layer_ids=(1, 2, 3),
        target_num_layers=4,
    )
    commands = render_commands(job)
    assert commands[0][commands[0].index("--data") + 1] == odd
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "speculators", ECHO_ARGV)
    lines: list[str] = []
    run_commands(commands[:1] + commands[2:], env={"PATH": str(bin_dir)}, on_line=lines.append)
    assert [json.loads(line) for line in lines] == [commands[0][1:], commands[2][1:]]


def test_a_job_without_torchrun_fails_before_anything_runs(tmp_path):
    bin_dir = tmp_path / "bin"
    ran = tmp_path / "ran"
    for name in ("speculators", "vllm"):
        stand_in(bin_dir, name, f"#!{sys.executable}\nopen({str(ran)!r}, 'a').write('ran')\n")
    job = SpeculatorsTrainJob(
        target="org/model",
        data=("/d",),
        work_dir=str(tmp_path / "w"),
        output_dir="/o",
        aux_layer_ids=(1, 2, 3),
        target_num_layers=4,
        gpus_per_node=8,
    )
    with pytest.raises(DraftsyncError) as raised:
        run_commands(render_commands(job), env={"PATH": str(bin_dir)})
    assert "torchrun not found on PATH" in str(raised.value)
    assert "install speculators and vllm on the GPU worker" in raised.value.fix
    with pytest.raises(DraftsyncError, match="torchrun not found"):
        run_job(job, env={"PATH": str(bin_dir)})
    assert not ran.exists()


def test_a_failing_step_stops_the_run_with_its_status(tmp_path):
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "speculators", f"#!{sys.executable}\nimport sys\nprint('bad data')\nsys.exit(3)\n")
    lines: list[str] = []
    with pytest.raises(DraftsyncError, match="speculators prepare-data` exited with status 3"):
        run_commands(
            [["speculators", "prepare-data"], ["speculators", "train"]],
            env={"PATH": str(bin_dir)},
            on_line=lines.append,
        )
    assert lines == ["bad data"]


FAKE_VLLM = textwrap.dedent(f"""\
    #!{sys.executable}
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    open(sys.argv[0] + ".log", "a").write("serve\\n")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.end_headers()
            self.wfile.write(b"{{}}")

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_run_job_serves_hidden_states_for_the_data_steps_and_stops_the_server_before_training(tmp_path):
    bin_dir = tmp_path / "bin"
    log = tmp_path / "steps.log"
    stand_in(bin_dir, "vllm", FAKE_VLLM)
    record = f"#!{sys.executable}\nimport sys\nopen({str(log)!r}, 'a').write(sys.argv[1] + '\\n')\n"
    stand_in(bin_dir, "speculators", record)
    port = free_port()
    out = tmp_path / "out"
    probe = (
        f"#!{sys.executable}\nimport os, socket, sys\n"
        f"up = socket.socket().connect_ex(('127.0.0.1', {port})) == 0\n"
        f"open({str(log)!r}, 'a').write('torchrun server-up=' + str(up) + '\\n')\n"
        f"[os.makedirs(os.path.join({str(out)!r}, epoch)) for epoch in ('0', '1', '10')]\n"
    )
    stand_in(bin_dir, "torchrun", probe)
    job = SpeculatorsTrainJob(
        target="org/model",
        data=("/d",),
        work_dir=str(tmp_path / "w"),
        output_dir=str(out),
        aux_layer_ids=(1, 2, 3),
        target_num_layers=4,
        gpus_per_node=2,
        vllm_port=port,
    )
    assert run_job(job, env={"PATH": str(bin_dir)}, on_line=lambda line: None) == out / "10"
    assert log.read_text().splitlines() == ["prepare-data", "generate-offline-data", "torchrun server-up=False"]
    assert (bin_dir / "vllm.log").read_text() == "serve\n"


def test_token_rows_are_what_prepare_data_passes_through(tmp_path):
    path = write_token_rows(tmp_path / "rows" / "a.jsonl", [[5, 6, 7], [8, 9]], [[0, 1, 1], [1, 1]])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
        {"input_ids": [8, 9], "loss_mask": [1, 1]},
    ]
    with pytest.raises(DraftsyncError, match="row 0"):
        write_token_rows(tmp_path / "b.jsonl", [[1, 2]], [[1]])


def _stand_in_vllm(tmp_path: Path, methods: str | None) -> dict[str, str]:
    """A `vllm` command whose interpreter imports a vllm package declaring `methods` (None: no vllm to import)."""
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    stand_in(bin_dir, "vllm", f"#!{sys.executable}\n")
    stand_in(bin_dir, "speculators", f"#!{sys.executable}\n")
    if methods is not None:
        (site / "vllm" / "config").mkdir(parents=True)
        (site / "vllm" / "__init__.py").write_text("")
        (site / "vllm" / "config" / "__init__.py").write_text("")
        (site / "vllm" / "version.py").write_text("__version__ = '0.6.0'\n")
        (site / "vllm" / "config" / "speculative.py").write_text(
            "from typing import Literal\n"
            f"Eagle = Literal['eagle', 'eagle3'{methods}]\n"
            "SpeculativeMethod = Literal['ngram', 'medusa', Eagle]\n"
        )
    return {"PATH": str(bin_dir), "PYTHONPATH": str(site)}


def test_a_vllm_without_hidden_state_extraction_is_refused_naming_its_version(tmp_path):
    """speculators' data generation serves the target with vLLM's extract_hidden_states method: an older vLLM is
    refused when the plan checks the worker, not when its server fails to start after the data is drawn."""
    with pytest.raises(DraftsyncError) as refused:
        check_installed(_stand_in_vllm(tmp_path / "old", ""))
    assert (
        "vllm 0.6.0 at" in refused.value.what and "no 'extract_hidden_states' speculative method" in refused.value.what
    )
    assert "upgrade vllm" in refused.value.fix and "trainer: draftsync" in refused.value.fix
    check_installed(_stand_in_vllm(tmp_path / "new", ", 'extract_hidden_states'"))  # the method nested in a Literal
    with pytest.raises(DraftsyncError) as refused:
        check_installed(_stand_in_vllm(tmp_path / "none", None))
    assert "cannot be imported by" in refused.value.what and "ModuleNotFoundError" in refused.value.what


def test_aux_ids_that_reach_the_last_layer_are_refused_before_a_server_starts(tmp_path):
    job = SpeculatorsTrainJob(
        target=write_target(tmp_path / "t", layers=4),
        data=("/d",),
        work_dir="/w",
        output_dir="/o",
        aux_layer_ids=(0, 2, 4),
    )
    with pytest.raises(DraftsyncError, match=r"(?s)include the target's last layer \(4\).*pick aux ids below 4"):
        hidden_state_server_command(job)
