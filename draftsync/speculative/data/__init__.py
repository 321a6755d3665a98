"""What drafters learn from: corpora, samples and the target's responses, hidden states (in shards or computed online),
the draft vocabulary and the training batch."""
