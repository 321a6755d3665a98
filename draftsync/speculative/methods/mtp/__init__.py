"""MTP: the MiMo-style multi-token-prediction head vLLM's `mtp` method runs, and its checkpoint layout."""
