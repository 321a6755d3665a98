"""The reference speculative-decoding engine: a method's proposer drafts, the target verifies."""
