"""The registry's tag schema: writers and readers agree, and no other module spells a tag key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.registry.tags import (
    DrafterVersion,
    TargetVersion,
    checklist_tags,
    drafter_tags,
    recommended_tags,
    target_tags,
    training_tags,
)

PACKAGE = Path(__file__).resolve().parents[3] / "draftsync"
HOME = PACKAGE / "registry" / "tags.py"
# Strings that start with "draftsync." and are no tag keys: Prefect events and their resource labels
# (tasks/events.py, the triggers' templates), module paths, a logger's name, a Message-ID domain.
NOT_TAGS = re.compile(r"""["']draftsync\.(serving\.|monitors[.:]|local|webhooks)""")


def test_a_drafter_version_reads_back_what_a_sync_writes():
    tags = {
        **drafter_tags("llm", 3, "eagle3.1", 4, validation_passed=True, metrics={"gamma_knee": 5.0}),
        **training_tags({"steps": 20}, 1, 2),
        **checklist_tags(
            [("acceptance", True)],
            profile="test",
            backend="reference",
            temperature=0.0,
            acceptance_rate=0.7,
            threshold=0.5,
            schedule=[[1, 4, 5]],
        ),
        **recommended_tags("eagle3", [2, 4], 3, False, "because"),
    }
    drafter = DrafterVersion.from_tags("llm-drafter", 7, tags)
    assert (drafter.trained_for, drafter.trained_for_version(), drafter.method, drafter.family) == (
        3,
        3,
        "eagle3.1",
        "eagle3",
    )
    assert (drafter.served_gamma(), drafter.gamma_measured, drafter.validation, drafter.validation_passed) == (
        4,
        5,
        "passed",
        True,
    )
    assert drafter.gamma_schedule() == [[1, 4, 5]] and drafter.data_check_failures == 2
    assert drafter.gamma_recommended == {"start": 3, "range": [2, 4], "method": "eagle3"}
    assert drafter.recommended_method == "eagle3"
    assert drafter.draft_sampling is None  # validated at T=0: nothing chosen, nothing recorded


def test_the_draft_sampling_validation_chose_is_recorded_and_read_back():
    tags = checklist_tags(
        [("acceptance", True)],
        profile="test",
        backend="vllm",
        temperature=1.0,
        acceptance_rate=0.7,
        threshold=0.5,
        draft_sampling="probabilistic",
    )
    assert tags["draftsync.draft_sampling"] == "probabilistic"
    assert DrafterVersion.from_tags("llm-drafter", 7, tags).draft_sampling == "probabilistic"


def test_strict_readers_name_the_tag():
    drafter = DrafterVersion.from_tags("llm-drafter", 2, {"draftsync.gamma_schedule": "[1,"})
    assert drafter.trained_for is None and drafter.validation == "unknown" and not drafter.validation_passed
    with pytest.raises(DraftsyncError, match="no draftsync.target.version tag"):
        drafter.trained_for_version()
    with pytest.raises(DraftsyncError, match="no draftsync.gamma tag"):
        drafter.served_gamma()
    with pytest.raises(DraftsyncError, match="draftsync.gamma_schedule='\\[1,', which is not JSON"):
        drafter.gamma_schedule()


def test_a_target_version_reads_its_facts():
    tags = target_tags(
        architecture="LlamaForCausalLM",
        hidden_size=64,
        num_layers=2,
        vocab_size=384,
        parameter_count=25000,
        task_mix={"code": 0.5, "math": 0.5},
    )
    target = TargetVersion.from_tags("llm", 1, tags)
    assert (target.architecture, target.hidden_size, target.num_hidden_layers, target.vocab_size) == (
        "LlamaForCausalLM",
        64,
        2,
        384,
    )
    assert target.task_mix() == {"code": 0.5, "math": 0.5} and target.parameter_count() == 25000
    assert TargetVersion.from_tags("llm", None, {}).task_mix() is None


def test_a_target_that_ships_its_own_head_and_the_head_registered_as_its_drafter_read_back():
    import json

    from draftsync.registry.tags import FEATURES_TAG, MTP_HEAD_FROM_TAG, MTP_HEAD_TAG, REFRESHED_HEAD

    shipping = TargetVersion.from_tags("mimo", 2, {FEATURES_TAG: json.dumps({"mtp_head": "mimo", "mtp_layers": 1})})
    assert shipping.mtp_head() == "mimo"
    assert TargetVersion.from_tags("llm", 1, {FEATURES_TAG: json.dumps({"mtp_head": None})}).mtp_head() is None
    assert TargetVersion.from_tags("llm", 1, {}).mtp_head() is None  # untagged: no head known
    head = DrafterVersion.from_tags("mimo-drafter", 4, {MTP_HEAD_TAG: REFRESHED_HEAD, MTP_HEAD_FROM_TAG: "3"})
    assert head.mtp_head == "refreshed" and DrafterVersion.from_tags("d", 1, {}).mtp_head is None


def test_no_other_module_spells_a_tag_key():
    spelled = re.compile(r"""["']draftsync\.""")
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in (HOME, PACKAGE / "tasks" / "events.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "event.resource" not in line and spelled.search(NOT_TAGS.sub("", line))
    ]
    assert not found, "use the constants and readers of draftsync/registry/tags.py:\n" + "\n".join(found)
