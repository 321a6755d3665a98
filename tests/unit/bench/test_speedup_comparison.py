"""What `bench/speedup.py --engine vllm` compares: every registered drafter method beside the baselines, and one
comparison row per target, temperature, concurrency and method at its fastest gamma."""

from __future__ import annotations

import pytest
from bench.speedup_vllm import comparison_markdown, comparison_rows, methods_to_measure
from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import METHODS, TRAINED_METHODS


def test_every_trained_method_is_measured_beside_the_draft_model_and_ngram():
    trained, measured = methods_to_measure()
    assert trained[0] == "eagle3" and set(trained) == {*TRAINED_METHODS, "draft_model"}
    assert measured == (*TRAINED_METHODS, "draft_model", "ngram")
    assert "dflash" in measured
    assert ("peagle" in measured) == ("peagle" in METHODS)  # a block drafter joins when it is registered


def test_a_subset_trains_only_what_it_serves_and_eagle3_for_the_draft_models_size():
    assert methods_to_measure(("ngram", "dflash")) == (("dflash",), ("dflash", "ngram"))
    assert methods_to_measure(("draft_model",)) == (("eagle3", "draft_model"), ("draft_model",))
    with pytest.raises(DraftsyncError, match="not ones this benchmark measures"):
        methods_to_measure(("lookahead",))


def figures(best_gamma: int, speedups: dict[int, float]) -> dict:
    rows = [
        {"gamma": g, "tau": 1.0 + g / 2, "bound": 2.0, "speedup": s, "fraction_of_bound": s / 2.0}
        for g, s in speedups.items()
    ]
    return {"c": 0.05, "verify": 1.1, "best_gamma": best_gamma, "gammas": rows}


def test_comparison_rows_take_each_method_at_its_fastest_gamma_per_target_and_concurrency():
    block = {
        "label": "demo-v2 padded to 319 MB",
        "T0": {
            "concurrency_1": {"dflash": figures(4, {2: 1.2, 4: 1.5}), "ngram": figures(2, {2: 1.1, 4: 0.9})},
            "concurrency_4": {"dflash": figures(2, {2: 1.3, 4: 1.2}), "ngram": figures(2, {2: 1.0, 4: 0.8})},
        },
        "T1": {},  # not measured
    }
    rows = comparison_rows({"weight-bound": block})
    assert [(r["concurrency"], r["method"], r["gamma"], r["speedup"]) for r in rows] == [
        (1, "dflash", 4, 1.5),
        (1, "ngram", 2, 1.1),
        (4, "dflash", 2, 1.3),
        (4, "ngram", 2, 1.0),
    ]
    assert {r["target"] for r in rows} == {"weight-bound"} and rows[0]["c"] == 0.05
    table = comparison_markdown({"comparison": rows, "targets": {"weight-bound": block}})
    lines = table.splitlines()
    assert lines[0] == "**demo-v2 padded to 319 MB**"
    assert lines[4:6] == [  # a method's rows together
        "| dflash | 0 | 1 | 4 | 3.00 | 0.050 | 2.00 | 1.50x | 0.75 |",
        "| dflash | 0 | 4 | 2 | 2.00 | 0.050 | 2.00 | 1.30x | 0.65 |",
    ]
