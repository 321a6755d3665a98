"""Helpers shared by the test tiers: servers, stubs, tiny models and fixtures several folders use."""
