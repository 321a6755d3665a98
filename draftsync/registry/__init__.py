"""MLflow: target and drafter versions, lineage tags and aliases."""

from draftsync.registry.model_registry import (
    CANDIDATE,
    PREVIOUS,
    PRODUCTION,
    ModelVersionInfo,
    Registry,
    drafter_model_name,
    target_tags,
)

__all__ = [
    "CANDIDATE",
    "PREVIOUS",
    "PRODUCTION",
    "ModelVersionInfo",
    "Registry",
    "drafter_model_name",
    "target_tags",
]
