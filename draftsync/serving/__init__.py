"""Serving: the CPU reference server, process management, vLLM launch arguments."""
