"""EAGLE-1: the drafter vLLM's EAGLE method runs and its checkpoint layout."""
