"""speculators' data generation for `trainer: speculators`, run here on the CPU: the vLLM launch draftsync renders
(`hidden_state_server_command`, with draftsync's connector) on vLLM's CPU build, then speculators' own `prepare-data`
and `generate-offline-data` (speculators 0.9.0, from `make compat`'s venv) against it. Every row's hidden states land
where speculators' trainer reads them and equal the target's own forward pass. Its training stays GPU-only, as
speculators requires.

One vLLM start; about 2 min on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

COMPAT_BIN = Path(__file__).resolve().parents[3] / ".venv-compat" / "bin"
ROWS = 6


def test_speculators_prepares_and_generates_hidden_states_from_vllms_cpu_build(built_targets, vllm_engine, tmp_path):
    import torch
    from draftsync.serving.process import free_port
    from draftsync.serving.vllm_engine import start_vllm_server, wait_until_serving
    from draftsync.speculative.data.corpora import mixed_texts
    from draftsync.speculative.data.hidden_states import capture
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.train.speculators import (
        SpeculatorsTrainJob,
        aux_layer_ids,
        generate_hidden_states_command,
        hidden_state_server_command,
        prepare_data_command,
        write_token_rows,
    )
    from safetensors.torch import load_file

    if not (COMPAT_BIN / "speculators").exists():
        pytest.fail(f"speculators is not installed in {COMPAT_BIN.parent}: run `make compat`")
    model, tokenizer = load_target(built_targets[1])
    rows = [list(tokenizer(text)["input_ids"])[:96] for _, text in mixed_texts({"code": 0.5, "math": 0.5}, ROWS, 5)]
    port = free_port()
    job = SpeculatorsTrainJob(
        target=str(built_targets[1]),
        data=(str(write_token_rows(tmp_path / "rows.jsonl", rows)),),
        work_dir=str(tmp_path / "work"),
        output_dir=str(tmp_path / "out"),
        seq_length=128,
        vllm_port=port,
    )
    server = start_vllm_server(
        vllm_engine, hidden_state_server_command(job), "127.0.0.1", port, tmp_path / "hidden-states-server.log"
    )
    environment = {**os.environ, "PATH": f"{COMPAT_BIN}{os.pathsep}{os.environ['PATH']}"}
    try:
        wait_until_serving(server, "speculators' hidden states")
        for command in (prepare_data_command(job), generate_hidden_states_command(job)):
            done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900, check=False)
            assert done.returncode == 0, (command[:2], done.stdout[-2000:], done.stderr[-3000:])
    finally:
        server.stop()

    written = sorted(Path(job.prepared_dir).rglob("hs_*.safetensors"))
    assert len(written) == ROWS, sorted(p.name for p in Path(job.prepared_dir).rglob("*"))[:40]
    layers = (*aux_layer_ids(job), len(model.get_decoder().layers))
    hidden = model.config.hidden_size
    seen = set()
    for path in written:
        saved = load_file(str(path))
        ids = saved["token_ids"].tolist()
        seen.add(tuple(ids))
        states = saved["hidden_states"]
        assert states.shape == (len(ids), len(layers), hidden)
        own = capture(model, torch.tensor([ids]), layers[:-1])
        expected = torch.stack([*own.aux[0].split(hidden, dim=-1), own.last[0]], dim=1)
        assert (states.float() - expected).abs().max().item() < 1e-4, path.name
    assert seen == {tuple(row) for row in rows}  # every row, each once
