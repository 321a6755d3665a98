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


def test_the_checklist_s_requests_end_at_the_target_s_eos_and_benchmark_requests_run_to_max_tokens(
    tiny_target, tiny_drafter
):
    request = EvalRequest(prompt="def add(a, b):", max_tokens=6, task="code")
    full = ReferenceBackend(tiny_target, tiny_drafter)
    [loaded] = full.generate([request], gamma=2, temperature=0.0, seed=0)
    full.close()
    assert loaded.output_tokens == 6
    # Make the target's third greedy token its EOS: a served request ends there, with the same first tokens.
    served = ReferenceBackend(tiny_target, tiny_drafter, ignore_eos=False)
    third = loaded.token_ids[2]
    assert third not in loaded.token_ids[:2], "the test needs a third token the target did not write before"
    served.tokenizer.eos_token = served.tokenizer.convert_ids_to_tokens(third)
    [ended] = served.generate([request], gamma=2, temperature=0.0, seed=0)
    # A request that asks to run past EOS (the checklist's long outputs) does, on the same backend.
    long = EvalRequest(prompt=request.prompt, max_tokens=6, task="code", ignore_eos=True)
    [past] = served.generate([long], gamma=2, temperature=0.0, seed=0)
    served.close()
    assert ended.token_ids == loaded.token_ids[:3]
    assert past.token_ids == loaded.token_ids
