"""What drafters learn from: corpora, samples and the target's responses, hidden states (in shards or computed online),
the draft vocabulary and the training batch."""


def shard_bytes_per_token(
    hidden: int, store_aux: bool, online: bool = False, state_bytes: int = 2, aux_layers: int = 3
) -> int:
    """Disk bytes of one token in a shard: its id (int32), its loss mask (bool), its final state and, for EAGLE-3,
    its `aux_layers` aux states (an MTP head's: one), `state_bytes` each (bf16 unless a build says otherwise; the
    offsets and task of a sequence are a few bytes more); online, the id and the mask only. Torch-free, so that a sync
    request can be planned where torch is not loaded."""
    widths = 0 if online else hidden * (1 + aux_layers if store_aux else 1)
    return widths * state_bytes + 4 + 1
