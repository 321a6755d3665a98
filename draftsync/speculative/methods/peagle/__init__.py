"""P-EAGLE: an EAGLE-3 drafter that drafts a whole proposal in one pass (vLLM's `parallel_drafting`)."""
