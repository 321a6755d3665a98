"""draftsync: keeps speculative-decoding drafters in sync with the LLMs they accelerate."""

__version__ = "0.1.0"
