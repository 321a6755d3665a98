"""The speculative-decoding fixtures (tests/support/speculative_fixtures.py): tiny seeded targets, drafters and data."""

from tests.support.speculative_fixtures import *  # noqa: F403
