"""A sync's DFlash settings reach the drafter it trains: the profile's block size and mask token, through TrainConfig
and the method registry, and no other method takes them."""

from __future__ import annotations

from draftsync.profiles import profile, with_changes
from draftsync.speculative.methods.registry import new_drafter_to_train
from draftsync.speculative.train.config import TrainConfig
from draftsync.speculative.train.drafters import new_drafter_for


def test_the_profiles_block_size_and_mask_token_reach_the_dflash_drafter(random_target):
    chosen = with_changes(profile("test"), "a test", method="dflash", block_size=4, mask_token_id=7)
    config = TrainConfig.from_profile(chosen, warm_start=False)
    config.aux_layer_ids = (1, 2, 3)  # the dataset's ids otherwise
    drafter = new_drafter_for(random_target, None, config)
    assert (drafter.method, drafter.fixed_positions, drafter.config.mask_token_id) == ("dflash", 3, 7)
    assert config.draft_vocab_size is None  # a DFlash drafter predicts through the target's own lm_head


def test_left_unset_the_drafter_keeps_its_defaults_and_other_methods_ignore_them(random_target):
    dflash = new_drafter_to_train("dflash", random_target.config, None, (1, 2, 3), 4, None, block_size=None)
    assert dflash.fixed_positions == 7  # the model's default block of 8
    medusa = new_drafter_to_train("medusa", random_target.config, None, None, 3, None, block_size=5, mask_token_id=1)
    assert medusa.fixed_positions == 3


def test_a_checkpoint_written_before_the_dflash_options_still_resumes():
    assert TrainConfig(block_size=None, mask_token_id=None).fingerprint() == TrainConfig().fingerprint()
    assert TrainConfig(method="dflash", block_size=4).fingerprint() != TrainConfig(method="dflash").fingerprint()
