"""What draftsync asks of the installed vLLM beyond serving, checked on the real engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


def test_the_installed_vllm_has_the_hidden_state_extraction_speculators_trains_from(tmp_path):
    """The probe behind `trainer: speculators`, against the real vLLM: it finds extract_hidden_states there (a stand-in
    of an older vLLM is refused in tests/integration/speculative/test_speculators_train.py)."""
    from draftsync.serving.vllm_engine import find_vllm_engine
    from draftsync.speculative.train.speculators import check_vllm_extracts_hidden_states

    engine = find_vllm_engine()
    assert engine is not None
    bin_dir = Path(engine.command[0]).parent
    assert (bin_dir / "vllm").exists(), f"no vllm command beside {engine.command[0]}"
    check_vllm_extracts_hidden_states({**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin"})
