"""Redaction hooks the traffic-capture tests name by their dotted path, as a deployment's `capture.redact` does."""

from __future__ import annotations

import re


def mask_digits(record: dict) -> dict:
    """Replace every digit of a completion prompt with '#': what a team does to card or account numbers."""
    if isinstance(record["prompt"], str):
        record["prompt"] = re.sub(r"[0-9]", "#", record["prompt"])
    return record


def skip_secrets(record: dict) -> dict | None:
    return None if "secret" in str(record["prompt"]) else record


def explode(record: dict) -> dict:
    raise RuntimeError("the redaction service is down")
