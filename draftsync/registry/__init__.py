"""MLflow: target and drafter versions, lineage tags and aliases."""

from draftsync.registry.model_registry import (
    CANDIDATE,
    PREVIOUS,
    PRODUCTION,
    ModelVersionInfo,
    Registry,
    drafter_model_name,
)
from draftsync.registry.tags import DrafterVersion, TargetVersion, target_tags

__all__ = [
    "CANDIDATE",
    "PREVIOUS",
    "PRODUCTION",
    "DrafterVersion",
    "ModelVersionInfo",
    "Registry",
    "TargetVersion",
    "drafter_model_name",
    "target_tags",
]
