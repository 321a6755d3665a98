"""The end-to-end tiers, a folder each: story (the demo, `make test-story`), system (real servers and worker
processes, `make test-system`) and vllm (real vLLM servers, `make test-vllm`)."""
