"""Acceptance metrics: parsing, the SQL store, trends, staleness rules, the report e-mail."""
