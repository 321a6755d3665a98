"""The MTP head's proposer: the EAGLE chain (vLLM drives both the same way), on the target's last layer only."""

from __future__ import annotations

from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods.eagle3.proposer import ChainProposer


class MtpProposer(ChainProposer):
    """Drafts token by token with an MtpHead: the engine hands it aux layer L, the target's pre-norm last state."""

    def check_target(self, target_model: Any) -> None:
        from draftsync.speculative.data.hidden_states import num_decoder_layers

        super().check_target(target_model)
        layers = num_decoder_layers(target_model)
        if self.aux_layer_ids != (layers,):  # it reads the last layer's output, whatever the depth
            raise DraftsyncError(
                f"the MTP head was built for a target of {self.aux_layer_ids[0]} layers (it reads the last one); "
                f"this target has {layers}",
                "serve the MTP head with the target it was built for, or speculation off",
            )
