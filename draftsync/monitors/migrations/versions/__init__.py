"""Revisions of the monitor store's schema, oldest first by their numbered ids."""
