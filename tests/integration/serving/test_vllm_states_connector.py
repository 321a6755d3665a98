"""A vLLM whose Python cannot load draftsync's hidden-states connector is refused before any server starts, with the
module, the import error and the fix; a reader started elsewhere refuses to read before it is started."""

from __future__ import annotations

import sys

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.vllm_engine import VllmEngine
from draftsync.serving.vllm_states import VllmStateReader, check_connector
from draftsync.speculative.data.vllm_connector import captured_layer_ids


def test_an_engine_without_the_connector_is_refused_naming_the_module_and_the_fix(tmp_path):
    """This interpreter has no vLLM, so the plugin module cannot import here."""
    engine = VllmEngine(
        command=(sys.executable, "-m", "vllm.entrypoints.openai.api_server"), interpreter=True, device="cpu"
    )
    with pytest.raises(DraftsyncError) as refused:
        check_connector(engine)
    assert "draftsync_hidden_states.DraftsyncHiddenStatesConnector" in refused.value.what
    assert "ModuleNotFoundError" in refused.value.what
    assert "make vllm" in refused.value.fix and "hidden_states_engine: transformers" in refused.value.fix


def test_a_stand_in_module_that_imports_passes(tmp_path, monkeypatch):
    (tmp_path / "draftsync_hidden_states.py").write_text("DraftsyncHiddenStatesConnector = object\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    check_connector(VllmEngine(command=(sys.executable,), interpreter=True, device="cpu"))


def test_the_server_caches_the_aux_layers_and_the_last_once_each_in_vllms_order():
    assert captured_layer_ids((2, 16, 29), 32) == (2, 16, 29, 32)
    assert captured_layer_ids((3, 1, 2), 3) == (1, 2, 3)  # an aux id at the last layer is cached once


def test_a_reader_not_started_says_how(tmp_path):
    from tests.support.tiny_models import build_tiny_target

    reader = VllmStateReader(build_tiny_target(tmp_path / "target"), (1, 2), tmp_path / "states")
    with pytest.raises(DraftsyncError, match="not started"):
        reader.states([[1, 2, 3]])
