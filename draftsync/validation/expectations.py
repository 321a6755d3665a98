"""Great Expectations over one pandas frame: what the dataset checks and the validation suite share.

Each run is ephemeral (nothing stored) and goes through `Batch.validate`: with numpy 2, GE 1.24 cannot serialise a
quantile expectation's numpy booleans into a stored validation-results store.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from great_expectations.core.expectation_validation_result import ExpectationValidationResult
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration


def expectation_types() -> Any:
    """`great_expectations.expectations`, imported with GE's usage analytics off (nothing leaves the machine)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations.expectations as gxe

    return gxe


def run_expectations(
    suite_name: str, frame: Any, expectations: Sequence[Any], result_format: dict[str, Any]
) -> list[ExpectationValidationResult]:
    """The result of each of `expectations` over `frame`, in the order given (GE reorders a suite's results)."""
    expectation_types()
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (
        context.data_sources.add_pandas(suite_name)
        .add_dataframe_asset("rows")
        .add_batch_definition_whole_dataframe("all")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    suite = gx.ExpectationSuite(name=suite_name)
    for index, expectation in enumerate(expectations):
        expectation.meta = {"check_index": index}
        suite.add_expectation(expectation)
    results = batch.validate(suite, result_format=result_format).results
    by_index = {expectation_of(result).meta["check_index"]: result for result in results}
    return [by_index[index] for index in range(len(expectations))]


def expectation_of(outcome: ExpectationValidationResult) -> ExpectationConfiguration:
    """The expectation a result is about: GE's type allows none, a suite's results always carry theirs."""
    config = outcome.expectation_config
    assert config is not None, "GE returned a suite result without its expectation"
    return config


def plain(value: Any) -> Any:
    """numpy scalars and lists as plain Python, so reports serialise to JSON."""
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value
