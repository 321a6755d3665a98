"""Fixtures for the reliability suite: tiny real checkpoints and a throwaway draftsync work dir.

The work dir is the one a worker sees through DRAFTSYNC_WORKDIR and MLFLOW_TRACKING_URI, as in
tests/conftest.py's `workdir`, but without the Prefect test harness: these tests call the tasks' own functions
(`task.fn`), so the suite stays fast and runs without a Prefect server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.reliability.workdirs import use_workdir


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    """A random-init HF Llama target with its tokenizer (seconds to build)."""
    from tests.support.tiny_models import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="session")
def tiny_drafter(tiny_target, tmp_path_factory) -> Path:
    """A random EAGLE-3 drafter for `tiny_target`, in the speculators format."""
    from tests.support.tiny_models import build_tiny_drafter

    return build_tiny_drafter(tiny_target, tmp_path_factory.mktemp("tiny-drafter"), gamma=2)


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Iterator[Path]:
    """A fresh work dir for one test; the cached registry and store are forgotten afterwards."""
    from draftsync.tasks import context

    yield use_workdir(monkeypatch, tmp_path)
    context.reset()
