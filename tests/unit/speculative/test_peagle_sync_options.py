"""A sync's P-EAGLE depths reach the drafter it trains (profile -> TrainConfig -> the method registry), the descriptor
module's defaults are the model's, and a method's own options stay out of other methods' fingerprints."""

from __future__ import annotations

from draftsync.profiles import profile, with_changes
from draftsync.speculative.train.config import TrainConfig
from draftsync.speculative.train.drafters import new_drafter_for


def test_the_profiles_max_draft_tokens_and_mask_token_reach_the_peagle_drafter(random_target):
    chosen = with_changes(profile("test"), "a test", method="peagle", max_draft_tokens=3, mask_token_id=7)
    config = TrainConfig.from_profile(chosen, warm_start=False)
    config.aux_layer_ids = (1, 2, 3)  # the dataset's ids otherwise
    config.draft_vocab_size = None  # a draft vocabulary is built from the dataset's counts, which this test has not
    drafter = new_drafter_for(random_target, None, config)
    assert (drafter.method, drafter.fixed_positions, drafter.config.mask_token_id) == ("peagle", 3, 7)
    assert config.block_size is None  # DFlash's block is not P-EAGLE's


def test_another_methods_checkpoint_resumes_whatever_the_block_options():
    """An EAGLE-3 sync's fingerprint is the one it had before the block drafters' options existed."""
    eagle3 = TrainConfig.from_profile(profile("production"), warm_start=False)
    assert (eagle3.block_size, eagle3.max_draft_tokens, eagle3.mask_token_id) == (None, None, None)
    dflash = TrainConfig.from_profile(with_changes(profile("production"), "a test", method="dflash"), False)
    assert (dflash.block_size, dflash.max_draft_tokens) == (8, None)
    peagle = TrainConfig.from_profile(with_changes(profile("production"), "a test", method="peagle"), False)
    assert peagle.max_draft_tokens == 6 and peagle.fingerprint() != TrainConfig(method="peagle").fingerprint()
