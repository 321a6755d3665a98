"""The reference backend borrows the process's torch threads while it measures, and gives them back."""

from __future__ import annotations

import torch
from draftsync.serving.evaluation import EvalRequest, ReferenceBackend


def test_closing_the_backend_restores_the_thread_count_it_found(tiny_target, tiny_drafter):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        backend = ReferenceBackend(tiny_target, tiny_drafter, threads=1)
        assert torch.get_num_threads() == 1
        [result] = backend.generate(
            [EvalRequest(prompt="def add(a, b):", max_tokens=4, task="code")], gamma=2, temperature=0.0, seed=0
        )
        assert result.output_tokens == 4
        backend.close()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
