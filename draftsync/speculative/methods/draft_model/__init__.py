"""The draft model: an independent small causal LM, the baseline the learned drafters must beat."""
