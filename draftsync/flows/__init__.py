"""Prefect flows, the demo story and the draftsync CLI."""
