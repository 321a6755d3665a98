"""The rendered `vllm serve` command: long form, real SpeculativeConfig keys, argv only. Its launch through
ServerProcess with a stand-in `vllm` executable is tests/integration/serving/test_vllm_args.py's."""

from __future__ import annotations

import dataclasses
import json

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.process import ServerProcess, free_port
from draftsync.serving.vllm_args import SpeculationSpec, check_schedule, render_vllm_command, reserved_flag_collisions

# Every field of vLLM's `SpeculativeConfig`, copied by hand from vllm/config/speculative.py (vllm-project/vllm
# at 002e77c1), so that the keys the renderer writes are checked against vLLM's, not against a list of our own.
# `tensor_parallel_size` is a field that exists only to be rejected, so it is left out: rendering it would fail.
VLLM_SPECULATIVE_CONFIG_FIELDS = {
    "enforce_eager",
    "num_speculative_tokens",
    "model",
    "method",
    "draft_tensor_parallel_size",
    "quantization",
    "moe_backend",
    "attention_backend",
    "kv_cache_dtype",
    "max_model_len",
    "revision",
    "code_revision",
    "index_share_for_mtp_iteration",
    "disable_padded_drafter_batch",
    "disable_eagle_block_drop",
    "use_local_argmax_reduction",
    "use_heterogeneous_vocab",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "parallel_drafting",
    "num_speculative_tokens_per_batch_size",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "draft_load_config",
    "rejection_sample_method",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
    "enable_adaptive_verification",
    "draft_sample_method",
    "dspark_draft_topk",
}

# One launch of each shape the renderer produces, for the key checks below.
RENDERINGS = [
    dict(drafter_dir="/d", method="eagle3", gamma=4),
    dict(drafter_dir="/d", method="eagle3.1", gamma=4, tensor_parallel_size=4),
    dict(drafter_dir="/d", method="eagle", gamma=3, schedule=[(1, 8, 3), (9, 256, 1)]),
    dict(drafter_dir="/d", method="medusa", gamma=3),
    dict(drafter_dir="/d", method="draft_model", gamma=2, tensor_parallel_size=2),
    dict(drafter_dir="/d", method="eagle3", gamma=2, draft_sampling="probabilistic"),
    dict(
        drafter_dir=None,
        method="ngram",
        gamma=4,
        prompt_lookup_min=2,
        prompt_lookup_max=4,
        schedule=[(1, 4, 4), (5, 64, 0)],
    ),
]


def render(drafter_dir, method, gamma, tensor_parallel_size=1, draft_sampling=None, extra_args=(), **speculation):
    """The launch for a drafter in `drafter_dir` (None: none), with SpeculationSpec's other fields as keywords."""
    return render_vllm_command(
        "/models/target",
        port=9000,
        served_model_name="m",
        speculation=SpeculationSpec(
            method=method,
            model=drafter_dir,
            num_speculative_tokens=gamma,
            draft_sample_method=draft_sampling,
            **speculation,
        ),
        tensor_parallel_size=tensor_parallel_size,
        extra_args=extra_args,
    )


def speculative_json(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


@pytest.mark.parametrize(
    "method, vllm_method", [("eagle3", "eagle3"), ("eagle3.1", "eagle3"), ("eagle", "eagle"), ("medusa", "medusa")]
)
def test_long_form_with_speculative_config(method, vllm_method):
    launch = render_vllm_command(
        "/models/target",
        port=8000,
        served_model_name="tiny",
        speculation=SpeculationSpec(method=method, model="/models/drafter", num_speculative_tokens=4),
        host="0.0.0.0",
    )
    assert launch.argv[:3] == ["vllm", "serve", "/models/target"]
    assert "--model" not in launch.argv  # the positional model; vLLM warns that --model will go away
    assert launch.argv[launch.argv.index("--host") + 1] == "0.0.0.0"
    assert launch.argv[launch.argv.index("--port") + 1] == "8000"
    assert launch.argv[launch.argv.index("--served-model-name") + 1] == "tiny"
    config = speculative_json(launch.argv)
    assert config == {"method": vllm_method, "model": "/models/drafter", "num_speculative_tokens": 4}
    assert config == launch.speculative_config


def test_draft_sampling_is_vllms_draft_sample_method_for_drafters_with_a_checkpoint_only():
    assert speculative_json(render("/d", "eagle", 2, draft_sampling="probabilistic").argv)["draft_sample_method"] == (
        "probabilistic"
    )
    assert "draft_sample_method" not in speculative_json(render("/d", "eagle", 2).argv)  # vLLM's default
    with pytest.raises(DraftsyncError, match="not ngram"):
        render(None, "ngram", 2, draft_sampling="probabilistic")
    with pytest.raises(DraftsyncError, match="'typical'"):
        render("/d", "eagle3", 2, draft_sampling="typical")


@pytest.mark.parametrize("case", RENDERINGS, ids=lambda case: case["method"])
def test_every_rendered_key_is_a_field_of_vllms_speculative_config(case):
    config = speculative_json(render(**case).argv)
    assert set(config) <= VLLM_SPECULATIVE_CONFIG_FIELDS
    assert "tensor_parallel_size" not in config


def test_the_rendered_keys_are_fields_of_the_installed_vllm():
    speculative = pytest.importorskip("vllm.config.speculative")
    fields = {field.name for field in dataclasses.fields(speculative.SpeculativeConfig)}
    rendered = {key for case in RENDERINGS for key in speculative_json(render(**case).argv)}
    assert rendered <= fields, rendered - fields


def test_rendered_schedules_pass_the_installed_vllms_check():
    dynamic = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    for case in RENDERINGS:
        schedule = render(**case).speculative_config.get("num_speculative_tokens_per_batch_size")
        if schedule:
            normalized = dynamic.validate_and_normalize_dynamic_sd_schedule(schedule)
            assert [(lo, hi, k) for lo, hi, _, _, k in normalized] == [tuple(entry) for entry in schedule]


def test_tensor_parallel_sets_the_draft_degree_too():
    launch = render("/d", "eagle3", 3, tensor_parallel_size=2)
    assert launch.argv[launch.argv.index("--tensor-parallel-size") + 1] == "2"
    assert speculative_json(launch.argv)["draft_tensor_parallel_size"] == 2
    assert "draft_tensor_parallel_size" not in speculative_json(render("/d", "eagle3", 3).argv)
    assert "--tensor-parallel-size" not in render("/d", "eagle3", 3).argv


def test_no_drafter_means_no_speculation():
    launch = render_vllm_command(
        "/t",
        port=9000,
        served_model_name="m",
        speculation=SpeculationSpec(method="eagle3", num_speculative_tokens=3),
        extra_args=["--max-model-len", "512"],
    )
    assert "--speculative-config" not in launch.argv
    assert launch.speculative_config is None
    assert launch.argv[-2:] == ["--max-model-len", "512"]
    off = render(None, "eagle3", 3, schedule=[(1, 8, 3)])
    assert off.speculative_config is None and "--speculative-config" not in off.argv


def test_schedule_becomes_inclusive_batch_size_ranges_sorted():
    launch = render("/d", "eagle3", 4, schedule=[(9, 64, 0), (1, 8, 4)])
    config = speculative_json(launch.argv)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 0]]
    assert config["num_speculative_tokens"] == 4
    assert config == launch.speculative_config
    assert "num_speculative_tokens_per_batch_size" not in speculative_json(render("/d", "eagle3", 4, schedule=[]).argv)


def test_schedule_from_the_registry_tag_round_trips():
    tag = json.dumps([(1, 7, 5), (8, 31, 5), (32, 64, 0)])  # what record_validation writes
    assert check_schedule(json.loads(tag), 5) == [[1, 7, 5], [8, 31, 5], [32, 64, 0]]


@pytest.mark.parametrize(
    "schedule, gamma, complaint",
    [
        ([(1, 8, 5)], 4, "k=5 with num_speculative_tokens=4"),
        ([(2, 8, 4)], 4, "starts at batch size 2"),
        ([(1, 8, 4), (8, 16, 2)], 4, "overlap"),
        ([(1, 0, 4)], 4, "batch sizes 1..0"),
        ([(1, 8, -1)], 4, "k=-1"),
        ([(1, 8)], 4, "not \\[first batch size, last batch size, k\\]"),
        ([(1, 8, 2.5)], 4, "not an integer"),
        ("[[1, 8, 4]]", 4, "is text"),
    ],
)
def test_bad_schedules_are_refused_with_the_reason(schedule, gamma, complaint):
    with pytest.raises(DraftsyncError, match=complaint):
        render("/d", "eagle3", gamma, schedule=schedule)


def test_a_gap_between_ranges_is_accepted_as_vllm_does():
    assert check_schedule([(1, 4, 3), (9, 16, 1)], 3) == [[1, 4, 3], [9, 16, 1]]


def test_ngram_needs_no_drafter_and_sets_the_lookup_window():
    config = render(None, "ngram", 4).speculative_config
    assert config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 5}
    assert render(None, "ngram", 3, prompt_lookup_max=4).speculative_config["prompt_lookup_min"] == 4
    window = render(None, "ngram", 3, tensor_parallel_size=2, prompt_lookup_min=2, prompt_lookup_max=6)
    assert window.speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 6,
    }
    with pytest.raises(DraftsyncError, match="drafts from the prompt"):
        render("/d", "ngram", 3)
    with pytest.raises(DraftsyncError, match="min=5, max=2"):
        render(None, "ngram", 3, prompt_lookup_min=5, prompt_lookup_max=2)
    with pytest.raises(DraftsyncError, match="only with method 'ngram'"):
        render("/d", "eagle3", 3, prompt_lookup_min=2)


def test_paths_with_shell_metacharacters_stay_single_arguments():
    drafter = "/tmp/d r'a\"f;ter $(rm -rf ~)"
    target = "/tmp/t a`rg`et|x"
    launch = render_vllm_command(
        target,
        port=9000,
        served_model_name="m",
        speculation=SpeculationSpec(method="eagle3", model=drafter, num_speculative_tokens=2),
    )
    assert launch.argv[2] == target
    assert speculative_json(launch.argv)["model"] == drafter
    assert all(isinstance(arg, str) for arg in launch.argv)


@pytest.mark.parametrize(
    "extra",
    [
        ["--port", "9001"],
        ["--port=9001"],
        ["--host", "0.0.0.0"],
        ["--model", "/other"],
        ["--model=/other"],
        ["--served_model_name", "x"],
        ["--served-model", "x"],
        ["--tensor-parallel-size", "2"],
        ["-tp", "2"],
        ["-tp=2"],
        ["--speculative-config", "{}"],
        ["--speculative-config.num_speculative_tokens", "9"],
        ["--speculative_config.method=ngram"],
    ],
)
def test_extra_args_may_not_set_what_draftsync_sets(extra):
    assert reserved_flag_collisions(extra) == [extra[0]]
    with pytest.raises(DraftsyncError, match="set flags that draftsync sets itself"):
        render("/d", "eagle3", 3, extra_args=extra)


def test_extra_args_that_only_look_alike_pass():
    extra = [
        "--max-model-len",
        "4096",
        "--model-impl",
        "vllm",
        "--port-range",
        "x",
        "--gpu-memory-utilization=0.9",
        "--hf-overrides",
        '{"port": 1}',
        "-O3",
    ]
    assert reserved_flag_collisions(extra) == []
    assert render("/d", "eagle3", 3, extra_args=extra).argv[-len(extra) :] == extra


def test_unservable_methods_are_refused_with_the_fix():
    with pytest.raises(DraftsyncError, match="'suffix' cannot be served") as raised:
        render("/d", "suffix", 2)
    assert "target alone" in raised.value.fix and "medusa" in raised.value.fix


def medusa_dir(tmp_path, num_heads, truncated_vocab_size=384):
    """A drafter directory with only the config.json fields the renderer reads."""
    directory = tmp_path / "medusa"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "draftsync_drafter": "medusa",
                "model_type": "medusa",
                "num_heads": num_heads,
                "vocab_size": 384,
                "truncated_vocab_size": truncated_vocab_size,
            }
        )
    )
    return directory


@pytest.mark.parametrize("gamma", [1, 3])
def test_medusa_serves_up_to_its_heads(tmp_path, gamma):
    directory = medusa_dir(tmp_path, 3)
    assert render(directory, "medusa", gamma).speculative_config == {
        "method": "medusa",
        "model": str(directory),
        "num_speculative_tokens": gamma,
    }


def test_medusa_gamma_above_its_heads_is_refused(tmp_path):
    directory = medusa_dir(tmp_path, 3)
    with pytest.raises(
        DraftsyncError, match=r"gamma 4 asks for more tokens than the medusa .* \(num_heads 3\)"
    ) as raised:
        render(directory, "medusa", 4)
    assert "gamma <= 3" in raised.value.fix and str(directory) in raised.value.what


def test_a_dflash_block_serves_up_to_its_draft_tokens_with_no_schedule(tmp_path):
    directory = tmp_path / "dflash"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"draftsync_drafter": "dflash", "max_draft_tokens": 5}))
    assert render(directory, "dflash", 5).speculative_config == {
        "method": "dflash",
        "model": str(directory),
        "num_speculative_tokens": 5,
    }
    with pytest.raises(DraftsyncError, match=r"gamma 6 .* dflash drafter .* \(max_draft_tokens 5\)") as raised:
        render(directory, "dflash", 6)
    assert "gamma <= 5" in raised.value.fix
    with pytest.raises(DraftsyncError, match="schedule was given for a dflash drafter"):
        render(directory, "dflash", 3, schedule=[(1, 8, 3), (9, 64, 1)])


def test_a_peagle_drafter_is_served_as_eagle3_with_parallel_drafting(tmp_path):
    """vLLM serves P-EAGLE as its EAGLE-3 model told to draft in parallel: one gamma, up to the depths trained."""
    directory = tmp_path / "peagle"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"speculators_model_type": "peagle", "max_draft_tokens": 4}))
    assert render(directory, "peagle", 4).speculative_config == {
        "method": "eagle3",
        "model": str(directory),
        "num_speculative_tokens": 4,
        "parallel_drafting": True,
    }
    assert "parallel_drafting" not in render(directory, "eagle3", 4).speculative_config
    with pytest.raises(DraftsyncError, match=r"gamma 5 .* peagle drafter .* \(max_draft_tokens 4\)") as raised:
        render(directory, "peagle", 5)
    assert "gamma <= 4" in raised.value.fix
    # vLLM sizes the masked slots once, for the largest gamma: a per-batch-size schedule is refused
    with pytest.raises(DraftsyncError, match="schedule was given for a peagle drafter"):
        render(directory, "peagle", 3, schedule=[(1, 8, 3), (9, 64, 1)])


def test_medusa_heads_over_part_of_the_vocabulary_are_refused(tmp_path):
    with pytest.raises(DraftsyncError, match="heads over 200 of the 384 tokens") as raised:
        render(medusa_dir(tmp_path, 3, truncated_vocab_size=200), "medusa", 2)
    assert "re-train" in raised.value.fix


def test_medusa_takes_no_schedule(tmp_path):
    with pytest.raises(DraftsyncError, match="schedule was given for a medusa drafter") as raised:
        render(medusa_dir(tmp_path, 3), "medusa", 3, schedule=[(1, 8, 3), (9, 64, 1)])
    assert "no schedule" in raised.value.fix
    assert (
        "num_speculative_tokens_per_batch_size"
        not in render(medusa_dir(tmp_path / "b", 3), "medusa", 3, schedule=[]).speculative_config
    )


def test_gamma_below_one_is_refused():
    with pytest.raises(DraftsyncError, match="gamma 0 is below 1"):
        render("/d", "eagle3", 0)


def test_a_vllm_missing_from_path_is_reported_with_the_fix(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    process = ServerProcess(
        render("/d", "eagle3", 2).argv, "127.0.0.1", free_port(), tmp_path / "x.log", env={"PATH": str(empty)}
    )
    with pytest.raises(DraftsyncError, match="'vllm' could not be started") as raised:
        process.start()
    assert "PATH" in raised.value.fix


def test_per_request_counts_are_asked_for_whenever_a_drafter_serves(tmp_path):
    from draftsync.serving.vllm_args import NO_SPECULATION, PER_REQUEST_METRICS_FLAG, render_vllm_command

    chat = {"port": 8000, "served_model_name": "chat"}
    drafter = SpeculationSpec(method="eagle3", model=tmp_path, num_speculative_tokens=2)
    speculating = render_vllm_command(tmp_path, speculation=drafter, **chat).argv
    assert speculating[speculating.index(PER_REQUEST_METRICS_FLAG) + 1] == "summary"
    plain = render_vllm_command(tmp_path, speculation=NO_SPECULATION, **chat).argv
    assert PER_REQUEST_METRICS_FLAG not in plain  # vLLM refuses the flag without speculation
    detailed = render_vllm_command(
        tmp_path, speculation=drafter, extra_args=[f"{PER_REQUEST_METRICS_FLAG}=detailed"], **chat
    ).argv
    assert speculating.count(PER_REQUEST_METRICS_FLAG) == 1 and PER_REQUEST_METRICS_FLAG not in detailed


@pytest.mark.parametrize(
    "config, refused",
    [
        ({"model_type": "qwen2", "hidden_size": 128, "num_attention_heads": 4, "head_dim": 64}, "uses hidden_size"),
        (
            {"model_type": "qwen3", "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 64}
            | {"max_window_layers": 2},
            "sliding window on 2 of its 4 layers",
        ),
        ({"model_type": "qwen2", "hidden_size": 128, "num_attention_heads": 4, "head_dim": 32}, None),
        ({"model_type": "qwen3", "hidden_size": 128, "num_attention_heads": 4, "head_dim": 64}, None),
        ({"model_type": "qwen2", "num_hidden_layers": 4, "use_sliding_window": False, "max_window_layers": 2}, None),
        (
            {"model_type": "gpt_oss", "num_hidden_layers": 2, "sliding_window": 64}
            | {"layer_types": ["full_attention", "sliding_attention"]},
            "not a sliding window on every even layer",
        ),
        (
            {"model_type": "gpt_oss", "num_hidden_layers": 2, "sliding_window": 64}
            | {"layer_types": ["sliding_attention", "full_attention"]},
            None,
        ),
    ],
)
def test_a_target_config_vllm_would_serve_wrongly_is_refused_at_render_time(tmp_path, config, refused):
    (tmp_path / "config.json").write_text(json.dumps(config))
    render = lambda: render_vllm_command(tmp_path, port=8000, served_model_name="m")  # noqa: E731
    if refused is None:
        assert render().argv[2] == str(tmp_path)
    else:
        with pytest.raises(DraftsyncError, match=refused) as caught:
            render()
        assert str(tmp_path) in caught.value.what and "reference" in caught.value.fix


@pytest.mark.parametrize(
    "config, model_impl",
    [
        ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4}, "transformers"),
        ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 4}, None),
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, None),
        ({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_local_experts": 8}, None),
    ],
)
def test_a_family_served_through_another_model_impl_gets_it_on_every_launch(tmp_path, config, model_impl):
    """vLLM's Mixtral class has no EAGLE-3 aux states, its Transformers backend has: plain and speculative servers
    of the target both run that backend; a deployment's own --model-impl wins."""
    from draftsync.serving.vllm_args import NO_SPECULATION

    (tmp_path / "config.json").write_text(json.dumps(config))
    drafter = SpeculationSpec(method="eagle3", model="/models/drafter", num_speculative_tokens=2)
    for speculation in (drafter, NO_SPECULATION):
        argv = render_vllm_command(tmp_path, port=8000, served_model_name="m", speculation=speculation).argv
        rendered = argv[argv.index("--model-impl") + 1] if "--model-impl" in argv else None
        assert rendered == model_impl
    chosen = render_vllm_command(
        tmp_path, port=8000, served_model_name="m", speculation=drafter, extra_args=["--model-impl=vllm"]
    ).argv
    assert "--model-impl" not in chosen and chosen[-1] == "--model-impl=vllm"


@pytest.mark.parametrize(
    "target_layers, draft_layers, refused",
    [
        (4, 2, True),  # 2 windowed against 2 + 2 full layers: groups of 2, the draft layers dealt into two
        (4, 1, False),  # one draft layer is in one group whatever the grouping
        (24, 2, False),  # gpt-oss-20b: 12 windowed against 14 full, under 1.5 times: one group of 14
    ],
)
def test_a_dflash_drafter_vllm_would_split_across_kv_cache_groups_is_refused(
    tmp_path, target_layers, draft_layers, refused
):
    """vLLM 0.32 asserts that a drafter's layers share one KV cache group; next to gpt-oss's alternating windowed
    and full layers a multi-layer DFlash drafter may not."""
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir(), drafter.mkdir()
    config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_local_experts": 8}
    (target / "config.json").write_text(json.dumps(config | {"num_hidden_layers": target_layers, "sliding_window": 64}))
    (drafter / "config.json").write_text(json.dumps({"num_hidden_layers": draft_layers}))
    spec = SpeculationSpec(method="dflash", model=str(drafter), num_speculative_tokens=3)

    def render():
        return render_vllm_command(target, port=8000, served_model_name="m", speculation=spec)

    if not refused:
        render()
        return
    with pytest.raises(DraftsyncError, match="splits a 2-layer DFlash drafter across KV cache groups") as caught:
        render()
    assert "eagle3" in caught.value.fix
    (target / "config.json").write_text(
        json.dumps(config | {"num_hidden_layers": target_layers, "sliding_window": None})
    )
    render()  # no windowed layers: one kind, one group
