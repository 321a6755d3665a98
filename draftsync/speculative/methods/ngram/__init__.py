"""N-gram prompt lookup: no model and no checkpoint, a proposer only."""
