"""EAGLE-3 and EAGLE 3.1: the drafter (whose decoder pieces EAGLE-1 shares) and the speculators checkpoint format."""
