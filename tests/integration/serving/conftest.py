"""Session-wide tiny checkpoints for the serving tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_models import build_tiny_drafter, build_tiny_target


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="session")
def tiny_drafter(tiny_target, tmp_path_factory) -> Path:
    return build_tiny_drafter(tiny_target, tmp_path_factory.mktemp("tiny-drafter"), gamma=3)
