"""Data checks: a good hidden-state dataset passes; each kind of bad one fails on the expectation that guards it."""

from __future__ import annotations

import shutil

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.samples import Sample
from draftsync.speculative.data.shard_writer import build_shards
from draftsync.validation.data_checks import run_data_checks
from safetensors.torch import load_file, save_file

VOCAB, HIDDEN = 96, 32
MIX = {"code": 0.5, "math": 0.5}


@pytest.fixture(scope="module")
def target():
    from transformers import LlamaConfig, LlamaForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    yield LlamaForCausalLM(config).eval()
    torch.set_num_threads(threads)


def make_samples(tasks: list[str]) -> list[Sample]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for i, task in enumerate(tasks):
        ids = torch.randint(VOCAB, (6 + i % 9,), generator=generator).tolist()
        out.append(Sample(task, ids, [1] * len(ids)))
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory, target):
    out = tmp_path_factory.mktemp("good")
    build_shards(target, make_samples(["code", "math"] * 10), out, (0, 1, 2), shard_tokens=60, batch_size=4)
    return out


def edited(good, tmp_path, edit) -> str:
    """A copy of the good dataset with its first shard's tensors changed by `edit(tensors)`."""
    copy = tmp_path / "bad"
    shutil.copytree(good, copy)
    shard = copy / "shard-00000.safetensors"
    tensors = load_file(str(shard))
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard))
    return str(copy)


def failure(dataset, config=None, mix=MIX) -> tuple[str, dict]:
    with pytest.raises(DraftsyncError) as caught:
        run_data_checks(dataset, config or {"hidden_size": HIDDEN, "vocab_size": VOCAB}, mix)
    report = caught.value.report
    return str(caught.value), {o.name: o.observed for o in report.failures}


def test_a_good_dataset_passes_every_expectation_with_its_observed_value(good, target):
    report = run_data_checks(good, target.config, MIX)
    assert report.passed and report.sequences == 20
    observed = {o.name: o.observed for o in report.outcomes}
    assert observed == {
        "expect_table_row_count_to_be_between": 20,
        "expect_column_distinct_values_to_be_in_set(task)": ["code", "math"],
        "expect_column_mean_to_be_between(is_code)": 0.5,
        "expect_column_mean_to_be_between(is_math)": 0.5,
        "expect_column_min_to_be_between(length)": 6,
        "expect_column_min_to_be_between(loss_tokens)": 6,
        "expect_column_sum_to_be_between(nonfinite)": 0,
        "expect_column_max_to_be_between(max_token_id)": observed["expect_column_max_to_be_between(max_token_id)"],
        "expect_column_distinct_values_to_equal_set(final_width)": [HIDDEN],
        "expect_column_distinct_values_to_equal_set(aux_width)": [3 * HIDDEN],
    }
    assert observed["expect_column_max_to_be_between(max_token_id)"] < VOCAB


def test_a_nan_or_inf_in_a_hidden_state_fails_the_finite_check(good, tmp_path):
    def poison(tensors):
        tensors["aux"][3, 5] = float("nan")
        tensors["final"][7, 0] = float("inf")

    message, failed = failure(edited(good, tmp_path, poison))
    assert failed == {"expect_column_sum_to_be_between(nonfinite)": 2}
    assert "expect_column_sum_to_be_between(nonfinite) [finite hidden states] observed 2" in message


def test_an_empty_sequence_fails_the_length_check(good, tmp_path):
    def empty_first(tensors):
        tensors["offsets"][1] = 0  # sequence 0 has no tokens; sequence 1 takes over its tokens

    message, failed = failure(edited(good, tmp_path, empty_first))
    assert failed["expect_column_min_to_be_between(length)"] == 0
    assert failed["expect_column_min_to_be_between(loss_tokens)"] == 0
    assert "expect_column_min_to_be_between(length) [no empty sequence] observed 0" in message


def test_a_sequence_without_training_targets_fails(good, tmp_path):
    def unmask_first(tensors):
        tensors["loss_mask"][: int(tensors["offsets"][1])] = False

    message, failed = failure(edited(good, tmp_path, unmask_first))
    assert failed == {"expect_column_min_to_be_between(loss_tokens)": 0}
    assert "every sequence has a training target" in message


def test_a_token_id_beyond_the_vocabulary_fails(good, tmp_path):
    def out_of_vocab(tensors):
        tensors["input_ids"][4] = VOCAB + 7

    message, failed = failure(edited(good, tmp_path, out_of_vocab))
    assert failed == {"expect_column_max_to_be_between(max_token_id)": VOCAB + 7}
    assert f"observed {VOCAB + 7}, expected max id <= {VOCAB - 1}" in message


def test_states_of_the_wrong_width_fail(good, tmp_path):
    def narrow(tensors):
        tensors["final"] = tensors["final"][:, :-1]

    message, failed = failure(edited(good, tmp_path, narrow))
    assert failed == {"expect_column_distinct_values_to_equal_set(final_width)": [HIDDEN - 1, HIDDEN]}  # shard 0 only
    assert "[final state width is the target's hidden size] observed [31, 32], expected [32]" in message
    # Checked against another target (hidden 48), both widths are wrong.
    _, failed = failure(good, {"hidden_size": 48, "vocab_size": VOCAB})
    assert failed == {
        "expect_column_distinct_values_to_equal_set(final_width)": [HIDDEN],
        "expect_column_distinct_values_to_equal_set(aux_width)": [3 * HIDDEN],
    }


def test_a_skewed_task_mix_fails_with_the_observed_share(tmp_path, target):
    build_shards(target, make_samples(["code"] * 15 + ["math"] * 5), tmp_path, (0, 1, 2))
    message, failed = failure(str(tmp_path))
    assert failed == {
        "expect_column_mean_to_be_between(is_code)": 0.75,
        "expect_column_mean_to_be_between(is_math)": 0.25,
    }
    assert "[share of task 'code'] observed 0.75, expected 0.500 +- 0.05" in message
    run_data_checks(str(tmp_path), {"hidden_size": HIDDEN, "vocab_size": VOCAB}, {"code": 0.72, "math": 0.28})
    _, failed = failure(str(tmp_path), mix={"code": 1.0})
    assert failed == {
        "expect_column_distinct_values_to_be_in_set(task)": ["code", "math"],
        "expect_column_mean_to_be_between(is_code)": 0.75,
    }
