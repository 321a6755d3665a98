"""Training a drafter: the loop, data-parallel ranks under torchrun, a step's memory, and the speculators trainer."""
