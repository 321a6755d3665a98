"""Online training behind a live vLLM server (its CPU build): the trainer asks the server for the states of each batch
it is about to train on and writes no shards; the server is killed midway, started again, and the run goes on with
the losses of the offline run (stored transformers states) within 2%. A server that cannot come back stops the run with
vLLM's own error, its last checkpoint kept, and the rerun resumes from it.

Three vLLM starts in all.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEPS = 40


@pytest.fixture(scope="module")
def datasets(built_targets, tmp_path_factory):
    """The same samples as stored states (transformers) and as tokens only."""
    from draftsync.speculative.data.corpora import mixed_texts
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.data.samples import teacher_forced_samples
    from draftsync.speculative.data.shard_writer import build_shards
    from draftsync.speculative.targets import load_target

    model, tokenizer = load_target(built_targets[1])
    aux = default_aux_layer_ids(num_decoder_layers(model))
    samples = list(teacher_forced_samples(tokenizer, mixed_texts({"code": 0.5, "math": 0.5}, 48, seed=3)))
    root = tmp_path_factory.mktemp("online-vllm")
    build_shards(model, samples, root / "stored", aux, shard_tokens=2048, max_seq_len=128)
    build_shards(model, samples, root / "tokens", aux, shard_tokens=2048, max_seq_len=128, online=True)
    return model, aux, root / "stored", root / "tokens"


def _config():
    from draftsync.speculative.train.config import TrainConfig

    return TrainConfig(draft_vocab_size=256, steps=STEPS, batch_size=4, seq_len=64, ttt_steps=2, seed=0)


def _reader(built_targets, model, aux, work, vllm_engine, restarts):
    from draftsync.serving.vllm_states import VllmStateReader
    from draftsync.speculative.data.hidden_states import num_decoder_layers
    from draftsync.speculative.data.vllm_connector import captured_layer_ids

    captured = captured_layer_ids(aux, num_decoder_layers(model))
    return VllmStateReader(built_targets[1], captured, work, engine=vllm_engine, restarts=restarts)


def _killing(reader, source, at_call: int):
    """`source`, with the reader's server killed (SIGKILL) just before its `at_call`-th batch."""
    calls = {"n": 0}

    def states(rows):
        calls["n"] += 1
        if calls["n"] == at_call:
            os.kill(reader.server.pid, signal.SIGKILL)
        return source(rows)

    return states


def test_online_training_behind_vllm_restarted_midway_has_the_offline_losses(
    datasets, built_targets, vllm_engine, tmp_path
):
    from draftsync.serving.vllm_states import aux_and_final
    from draftsync.speculative.data.hidden_states import final_norm_of, num_decoder_layers
    from draftsync.speculative.data.online_states import OnlineDataset
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.train.training import fit_drafter

    model, aux, stored, tokens = datasets
    _, offline = fit_drafter(model, ShardDataset(stored), _config())
    with _reader(built_targets, model, aux, tmp_path / "vllm", vllm_engine, restarts=1) as reader:
        first_pid = reader.server.pid
        source = aux_and_final(reader, aux, num_decoder_layers(model), final_norm_of(model))
        online_data = OnlineDataset(tokens, None, states=_killing(reader, source, STEPS // 2))
        _, online = fit_drafter(model, online_data, _config())
        assert reader.server.pid != first_pid and reader.restarts == 0  # started again, once
        assert not any(reader.storage.iterdir())  # every states file read and removed
    print(json.dumps({"offline_losses": offline.losses, "online_losses": online.losses}))
    assert online.steps == offline.steps == STEPS
    assert online.losses == pytest.approx(offline.losses, rel=2e-2)  # float32 from vLLM against bfloat16 on disk
    assert not list(tokens.glob("*aux*")) and ShardDataset(tokens).stores_states is False


def test_a_server_that_does_not_come_back_stops_the_run_which_resumes_from_its_checkpoint(
    datasets, built_targets, vllm_engine, tmp_path
):
    from draftsync.errors import DraftsyncError
    from draftsync.serving.vllm_states import aux_and_final
    from draftsync.speculative.data.hidden_states import final_norm_of, num_decoder_layers
    from draftsync.speculative.data.online_states import OnlineDataset
    from draftsync.speculative.train.training import fit_drafter

    model, aux, _, tokens = datasets
    checkpoints = tmp_path / "checkpoints"
    config = replace(_config(), checkpoint_every=10)
    layers = num_decoder_layers(model)
    with _reader(built_targets, model, aux, tmp_path / "dies", vllm_engine, restarts=0) as reader:
        source = aux_and_final(reader, aux, layers, final_norm_of(model))
        with pytest.raises(DraftsyncError) as died:
            fit_drafter(
                model, OnlineDataset(tokens, None, states=_killing(reader, source, 25)), config, None, checkpoints
            )
    assert "vLLM taking the hidden states" in died.value.what and "died" in died.value.what
    kept = sorted(p.name for p in checkpoints.iterdir())
    assert kept, "the checkpoint before the server died is kept"
    with _reader(built_targets, model, aux, tmp_path / "again", vllm_engine, restarts=0) as reader:
        source = aux_and_final(reader, aux, layers, final_norm_of(model))
        _, resumed = fit_drafter(model, OnlineDataset(tokens, None, states=source), config, None, checkpoints)
    assert resumed.resumed_from_step >= 10 and resumed.steps == STEPS
