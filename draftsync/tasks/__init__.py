"""Prefect tasks: thin wrappers adding retries, artifacts and progress over the packages below."""
