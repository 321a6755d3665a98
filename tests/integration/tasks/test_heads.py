"""A target's own MTP head in a sync's tasks: saved as shipped, and refreshed on the target's answers, a retrain's
captured traffic taking its share of them, as a dataset's; both saved as the checkpoint vLLM's method mtp loads."""

from __future__ import annotations

import torch


def test_the_shipped_head_is_saved_as_it_ships_and_a_refresh_answers_captured_traffic_too(built_mimo_targets, tmp_path):
    from draftsync.profiles import profile
    from draftsync.speculative.methods.mtp.checkpoint import load_mtp, read_shipped_mtp
    from draftsync.speculative.methods.registry import drafter_method
    from draftsync.tasks.heads import refresh_shipped_head, save_shipped_head

    target = str(built_mimo_targets[2])
    shipped = save_shipped_head.fn(target, str(tmp_path / "shipped"), 3)
    assert drafter_method(shipped) == "mtp"
    as_shipped = read_shipped_mtp(target)
    saved = load_mtp(shipped, torch.float32)
    for (name, ours), (_, theirs) in zip(
        saved.layer.state_dict().items(), as_shipped.layer.state_dict().items(), strict=True
    ):
        assert torch.allclose(ours, theirs, atol=1e-2), name  # stored in bf16

    small = profile("test").model_copy(update={"generated_samples": 12, "warm_start_steps": 3, "captured_share": 0.5})
    captured = [f"def handler_{i}(request):\n    return" for i in range(20)]
    refresh = refresh_shipped_head.fn(target, {"code": 1.0}, small, str(tmp_path / "refreshed"), 3, captured)
    assert refresh.steps == 3 and refresh.samples > refresh.captured > 0, refresh
    assert drafter_method(tmp_path / "refreshed") == "mtp"
    plain = refresh_shipped_head.fn(target, {"code": 1.0}, small, str(tmp_path / "plain"), 3)
    assert plain.captured == 0 and plain.samples == 12
