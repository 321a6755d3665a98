"""DFlash: a block of draft tokens in one pass over the target's hidden states, in the layout vLLM's DFlash loads."""
