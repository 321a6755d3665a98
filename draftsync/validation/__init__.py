"""Validation without Prefect: the checklist's gates and gamma knee, the Great Expectations suites over the
dataset and the results, the stress run against a served pair, and the plots a reviewer reads."""
