"""The drafter a training starts from: built for the target with the draft vocabulary its data calls for, and
warm-started from the previous target version's drafter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from draftsync.speculative.methods import METHODS

if TYPE_CHECKING:
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.train.config import TrainConfig


def new_drafter_for(target_model: Any, dataset: ShardDataset, config: TrainConfig):
    """A fresh drafter of `config.method` shaped for the target, with its draft vocabulary from the data.

    `draft_model` (the benchmark's independent small LM) gets the parameter budget of an EAGLE-3 drafter's
    own weights unless one is given.
    """
    import torch

    from draftsync.speculative.data.draft_vocab import build_draft_vocab
    from draftsync.speculative.methods.registry import new_drafter_to_train

    target_config = target_model.config
    vocab_size = target_config.vocab_size
    draft_vocab_size = config.draft_vocab_size or vocab_size
    aux = None
    if METHODS[config.method].reads_aux_states:  # the training's ids, else the dataset's
        aux = config.aux_layer_ids if config.aux_layer_ids is not None else dataset.aux_layer_ids
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        drafter = new_drafter_to_train(
            config.method,
            target_config,
            None if draft_vocab_size == vocab_size else draft_vocab_size,
            aux,
            medusa_heads=config.medusa_heads,
            draft_model_parameters=config.draft_model_parameters,
            block_size=config.block_size,
            mask_token_id=config.mask_token_id,
            max_draft_tokens=config.max_draft_tokens,
        )
    if drafter.config.draft_vocab_size < vocab_size:
        d2t, t2d = build_draft_vocab(dataset.token_counts(), drafter.config.draft_vocab_size)
        drafter.set_draft_vocab(d2t, t2d)
    drafter.initialise_from_target(target_model, freeze_embeddings=config.freeze_embeddings)
    return drafter


def warm_start(drafter: Any, source: Any) -> int:
    """Copy every same-named, same-shaped tensor of `source` into `drafter`; returns how many were copied.

    Output heads are copied row by row, following each row's target token id, so a draft vocabulary that
    moved between target versions keeps what the old drafter knew about the ids both share.
    """
    import torch

    if source.method != drafter.method:
        return 0
    own = drafter.state_dict()
    copied = 0
    head_names = {name for name in own if name.endswith("lm_head.weight")}
    # frozen copies of the target (its embedding) come from this target, never from the previous one's drafter
    from_target = set(drafter.target_copy_names) & {n for n, p in drafter.named_parameters() if not p.requires_grad}
    with torch.no_grad():
        for name, tensor in source.state_dict().items():
            if (
                name in ("d2t", "t2d")
                or name in from_target
                or name not in own
                or own[name].shape[1:] != tensor.shape[1:]
            ):
                continue
            if name in head_names:
                rows_of = {int(t): i for i, t in enumerate(source.draft_token_ids.tolist())}
                for row, target_id in enumerate(drafter.draft_token_ids.tolist()):
                    if target_id in rows_of:
                        own[name][row].copy_(tensor[rows_of[target_id]])
                copied += 1
            elif own[name].shape == tensor.shape:
                own[name].copy_(tensor)
                copied += 1
    return copied
