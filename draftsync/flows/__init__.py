"""Prefect flows and their deployment definitions: what Prefect schedules, triggers and runs."""
