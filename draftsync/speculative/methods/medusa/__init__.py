"""Medusa: K heads over the target's final state, and the checkpoint layout vLLM's Medusa method loads."""
