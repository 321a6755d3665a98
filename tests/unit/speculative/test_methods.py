"""The drafter methods' registry: one descriptor per method, and no other module spelling a method's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import (
    CHECKPOINT_METHODS,
    EAGLE3,
    EAGLE3_1,
    METHODS,
    TRAINED_METHODS,
    VLLM_METHODS,
    drafter_family,
    eagle3_variant,
    is_eagle3_family,
    method_named,
)

PACKAGE = Path(__file__).resolve().parents[3] / "draftsync"
HOME = PACKAGE / "speculative" / "methods" / "__init__.py"


def test_the_registry_names_each_method_and_what_vllm_calls_it():
    assert TRAINED_METHODS == ("eagle3", "eagle3.1", "eagle", "medusa", "dflash", "peagle")
    # the MTP head is built and trained here, but no sync trains it (its dataset reads the target's last layer alone)
    assert set(VLLM_METHODS) == set(TRAINED_METHODS) | {"mtp", "draft_model", "ngram"}
    assert "ngram" not in CHECKPOINT_METHODS
    assert {name: METHODS[name].vllm_method for name in VLLM_METHODS} == {
        "eagle3": "eagle3",
        "eagle3.1": "eagle3",
        "eagle": "eagle",
        "medusa": "medusa",
        "dflash": "dflash",
        "peagle": "eagle3",
        "mtp": "mtp",
        "draft_model": "draft_model",
        "ngram": "ngram",
    }
    assert [m for m in VLLM_METHODS if METHODS[m].chains] == ["eagle3", "eagle3.1", "eagle", "mtp"]
    assert [m for m in VLLM_METHODS if METHODS[m].fixed_heads] == ["medusa", "dflash", "peagle"]
    assert {m: METHODS[m].gamma_limit_field for m in VLLM_METHODS if METHODS[m].gamma_limit_field} == {
        "medusa": "num_heads",
        "dflash": "max_draft_tokens",
        "peagle": "max_draft_tokens",
    }
    assert [m for m in VLLM_METHODS if METHODS[m].drafts_block] == ["dflash", "peagle"]
    # vLLM's own dflash drafts in parallel by itself; an EAGLE-3 layer is told to
    assert [m for m in VLLM_METHODS if METHODS[m].parallel_drafting] == ["peagle"]


def test_the_eagle3_family_is_one_test():
    assert is_eagle3_family("eagle3") and is_eagle3_family("eagle3.1")
    assert not any(
        is_eagle3_family(m) for m in ("eagle", "medusa", "dflash", "peagle", "draft_model", "ngram", "none", None)
    )
    assert drafter_family("none") is None and EAGLE3.family == EAGLE3_1.family
    assert (eagle3_variant(True, True), eagle3_variant(True, False)) == ("eagle3.1", "eagle3")


def test_an_unknown_method_is_named_with_the_list():
    with pytest.raises(DraftsyncError, match="'lookahead' is unknown") as error:
        method_named("lookahead", among=TRAINED_METHODS)
    assert "eagle3, eagle3.1, eagle, medusa" in error.value.fix
    assert method_named("ngram") is METHODS["ngram"]


def test_no_other_module_spells_a_method_name():
    """Adding a method touches methods/__init__.py, not a tuple or an `if` in every module."""
    names = "|".join(re.escape(m) for m in TRAINED_METHODS)
    spelled = re.compile(rf"""(["'])({names})\1""")
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != HOME
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert not found, "use the descriptors of draftsync/speculative/methods/__init__.py:\n" + "\n".join(found)
