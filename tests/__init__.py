"""The test suite is a package, so its helpers are imported one way: `from tests.<folder>.<module> import ...`."""
