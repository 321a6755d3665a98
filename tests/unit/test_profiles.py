"""Sync profiles by name and from a file: a file overrides the demo profile field by field, bad files say where."""

from __future__ import annotations

import pytest
from draftsync.errors import DraftsyncError
from draftsync.profiles import profile


def test_a_profile_file_overrides_the_demo_profile_field_by_field(tmp_path):
    path = tmp_path / "gpu-small.yaml"
    path.write_text("method: eagle3.1\ntrain_steps: 1234\nvalidation:\n  requests: 50\n  min_p5: 0.4\n")
    chosen = profile(str(path))
    demo = profile("demo")
    assert (chosen.name, chosen.method, chosen.train_steps) == ("gpu-small", "eagle3.1", 1234)
    assert (chosen.validation.requests, chosen.validation.min_p5) == (50, 0.4)
    assert chosen.batch_size == demo.batch_size and chosen.validation.max_tokens == demo.validation.max_tokens


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("train_steps: -3\n", "train_steps"),
        ("method: medusa2\n", "method"),
        ("validation:\n  min_p50: 2\n", "validation.min_p50"),
        ("- a list\n", "not a mapping"),
        ("train_steps: [unclosed\n", "is not valid YAML at line 2, column 1"),
        ("", "holds no fields"),
        ("# only a comment\n", "holds no fields"),
        ("validation: 0\n", "validation is int 0, not a section of fields"),
        ("validation: []\n", "validation is list [], not a section of fields"),
        # a typo or an impossible number is refused, not ignored
        ("train_step: 5\n", "train_step: Extra inputs are not permitted"),
        ("lr: -5\n", "lr: Input should be greater than 0"),
        ("train_steps: 99999999999999999999999\n", "train_steps: Input should be less than or equal to 1000000000"),
        ("lr: .nan\n", "lr: Input should be a finite number"),
        ("validation:\n  min_acceptanse: 0.5\n", "validation.min_acceptanse: Extra inputs are not permitted"),
        ("validation: abc\n", "validation is str 'abc', not a section of fields"),
        ("train_nodes: 2\n", "train_nodes 2 needs train_rendezvous: HOST:PORT of the first node"),
        ("train_rendezvous: node-0\n", "train_rendezvous 'node-0' is not HOST:PORT"),
        ("method: eagle\ntrainer: speculators\n", "trainer speculators trains EAGLE-3 drafters, not eagle"),
        ("data_parallel: zero3\n", "data_parallel: Input should be 'auto', 'ddp' or 'fsdp'"),
    ],
)
def test_a_bad_profile_file_names_the_field_and_the_file(tmp_path, text, named):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(DraftsyncError) as error:
        profile(str(path))
    assert named in error.value.what and str(path) in error.value.what and error.value.fix


def test_unknown_names_and_missing_files_are_refused_with_the_choices():
    with pytest.raises(DraftsyncError) as error:
        profile("fast")
    assert "production" in error.value.fix and "YAML/JSON" in error.value.fix
    with pytest.raises(DraftsyncError, match="profile.yaml does not exist"):
        profile("/nonexistent/profile.yaml")
    assert profile("production").validation.name == "production"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("method: dflash\nblock_size: 1\n", "block_size: Input should be greater than or equal to 2"),
        ("method: dflash\nblock_size: 17\n", "block_size: Input should be less than or equal to 16"),
        ("method: dflash\nblock_size: 3\ngamma: 4\n", "gamma 4 is more than a dflash block of block_size 3 drafts"),
        ("method: dflash\nblock_size: 4\nvalidation:\n  gamma_range: [5, 8]\n", "gamma_range [5, 8] starts above"),
        ("method: dflash\nmask_token_id: -1\n", "mask_token_id: Input should be greater than or equal to 0"),
    ],
)
def test_a_dflash_block_vllm_cannot_serve_is_refused_when_the_profile_is_read(tmp_path, text, named):
    path = tmp_path / "dflash.yaml"
    path.write_text(text)
    with pytest.raises(DraftsyncError) as error:
        profile(str(path))
    assert named in error.value.what and error.value.fix


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("method: peagle\nmax_draft_tokens: 0\n", "max_draft_tokens: Input should be greater than or equal to 1"),
        ("method: peagle\nmax_draft_tokens: 17\n", "max_draft_tokens: Input should be less than or equal to 16"),
        (
            "method: peagle\nmax_draft_tokens: 3\ngamma: 4\n",
            "gamma 4 is more than a peagle drafter of max_draft_tokens 3 drafts (3): use gamma <= 3 or "
            "max_draft_tokens >= 4",
        ),
        (
            "method: peagle\nmax_draft_tokens: 4\nvalidation:\n  gamma_range: [5, 8]\n",
            "gamma_range [5, 8] starts above the 4 tokens a peagle drafter of max_draft_tokens 4 drafts",
        ),
    ],
)
def test_a_peagle_proposal_longer_than_its_depths_is_refused_when_the_profile_is_read(tmp_path, text, named):
    path = tmp_path / "peagle.yaml"
    path.write_text(text)
    with pytest.raises(DraftsyncError) as error:
        profile(str(path))
    assert named in error.value.what and error.value.fix


def test_a_peagle_profile_drafts_up_to_its_depths_and_other_methods_ignore_them(tmp_path):
    """P-EAGLE's gamma may reach max_draft_tokens (no committed token in its count, unlike a DFlash block)."""
    from draftsync.profiles import with_changes

    chosen = with_changes(profile("production"), "sync --method peagle", method="peagle", max_draft_tokens=4)
    assert (chosen.max_draft_tokens, chosen.gamma) == (4, 4)
    assert profile("production").max_draft_tokens == 6  # the drafter's default depths
    # another method's gamma is not bound by P-EAGLE's depths, nor by DFlash's block
    assert with_changes(profile("production"), "sync", gamma=8, max_draft_tokens=2, block_size=2).gamma == 8


def test_a_dflash_profile_sweeps_within_its_block_and_a_commands_options_are_checked_alike():
    from draftsync.profiles import with_changes

    chosen = with_changes(profile("production"), "sync --method dflash", method="dflash")
    assert (chosen.block_size, chosen.gamma, chosen.validation.gamma_range) == (8, 4, (2, 8))  # swept up to 7
    with pytest.raises(DraftsyncError) as error:
        with_changes(profile("demo"), "sync --block-size 20", method="dflash", block_size=20)
    assert "sync --block-size 20: block_size" in error.value.what and "option" in error.value.fix
    with pytest.raises(DraftsyncError, match="gamma 4 is more than a dflash block of block_size 4"):
        with_changes(profile("production"), "sync", method="dflash", block_size=4)
