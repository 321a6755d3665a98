"""`draftsync recommend` on the command line: the answer it prints, the JSON it writes, its errors and its help."""

from __future__ import annotations

import json

import pytest
import typer
from draftsync.cli.recommend import recommend_command
from draftsync.errors import DraftsyncError
from draftsync.planning.recommendation import recommend
from typer.testing import CliRunner

from tests.unit.planning.test_recommendation import workload


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, so the command is called by name as in the draftsync app
    app.command(name="recommend")(recommend_command)
    return app


def test_cli_prints_the_answer_and_writes_json(tmp_path):
    json_path = tmp_path / "out" / "recommendation.json"
    result = CliRunner().invoke(
        _cli(),
        [
            "recommend",
            "--params",
            "70B",
            "--gpus",
            "4",
            "--gpu-memory-gb",
            "80",
            "--tpot-ms",
            "25",
            "--task",
            "code",
            "--output-tokens",
            "6000",
            "--batch",
            "1",
            "--json",
            str(json_path),
        ],
    )
    assert result.exit_code == 0, result.output
    # single-stream code at gamma 6-8: the block rule's DFlash replaces the EAGLE 3.1 the upgrade rules chose
    assert "method:   dflash" in result.output
    assert "gamma:    6-8, start at 6" in result.output
    assert "fits:     yes" in result.output
    assert "[size:sweet-spot]" in result.output and "[upgrade:latency, upgrade:long-output" in result.output
    assert "[block:dflash]" in result.output and "[serving:vllm-block]" in result.output
    written = json.loads(json_path.read_text())
    assert set(written) == {
        "method",
        "gamma_range",
        "gamma_start",
        "expected_speedup",
        "drafter_memory_gb",
        "fits",
        "memory",
        "reasons",
    }
    expected = recommend(workload(tpot_ms=25, task="code", output_tokens=6000)).to_dict()
    assert written == expected
    assert written["gamma_range"] == [6, 8] and written["memory"]["required_gb"] == pytest.approx(213.8)  # 7%


def test_cli_gives_vllms_limits_for_medusa():
    result = CliRunner().invoke(
        _cli(),
        [
            "recommend",
            "--params",
            "180B",
            "--gpus",
            "8",
            "--gpu-memory-gb",
            "80",
            "--tpot-ms",
            "50",
            "--task",
            "chat",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "method:   medusa\n" in result.output
    assert "[serving:vllm-medusa]: vLLM serves it (method 'medusa') with one gamma at every batch size" in result.output


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--params", "seventy"], "--params"),
        (["--task", "poetry"], "task"),
        (["--gpus", "0"], "gpus"),
    ],
)
def test_cli_bad_input_raises_the_project_error(arguments, named):
    base = {"--params": "70B", "--gpus": "4", "--gpu-memory-gb": "80", "--tpot-ms": "25", "--task": "code"}
    options = {**base, **dict(zip(arguments[::2], arguments[1::2], strict=True))}
    argv = ["recommend"] + [item for pair in options.items() for item in pair]
    result = CliRunner().invoke(_cli(), argv)
    assert isinstance(result.exception, DraftsyncError)
    assert named in result.exception.what


def test_cli_help_lists_every_option():
    result = CliRunner().invoke(_cli(), ["recommend", "--help"])
    assert result.exit_code == 0
    options = ("--params", "--gpus", "--gpu-memory-gb", "--tpot-ms", "--task", "--output-tokens", "--batch", "--json")
    for option in options:
        assert option in result.output


def test_cli_reads_a_registered_targets_size_and_kv_cache_from_its_tags(workdir, built_targets):
    from draftsync.cli.app import app
    from draftsync.tasks.registration import publish_target

    publish_target("sized-llm", str(built_targets[1]), {"code": 1.0})
    args = ["--gpus", "1", "--gpu-memory-gb", "24", "--tpot-ms", "50", "--task", "code", "--batch", "4"]
    result = CliRunner().invoke(app, ["--workdir", str(workdir), "recommend", "--target", "sized-llm", *args])
    assert result.exit_code == 0, result.output
    # The built-in test target: 4 layers x 4 KV heads x head_dim 32 x 2 (K and V) x 2 bytes = 2048 bytes a token.
    assert "the KV cache of 4 x 1024 tokens x 2048 bytes" in result.output
    assert "own head" not in result.output
    with pytest.raises(DraftsyncError, match="not both"):
        recommend_command(gpus=1, gpu_memory_gb=24, tpot_ms=50, task="code", params="7B", target="sized-llm")


def test_cli_says_a_registered_target_ships_its_own_head(workdir, built_mimo_targets):
    from draftsync.cli.app import app
    from draftsync.tasks.registration import publish_target

    publish_target("mimo-llm", str(built_mimo_targets[1]), {"code": 1.0})
    args = ["--gpus", "1", "--gpu-memory-gb", "24", "--tpot-ms", "50", "--task", "code"]
    result = CliRunner().invoke(app, ["--workdir", str(workdir), "recommend", "--target", "mimo-llm:1", *args])
    assert result.exit_code == 0, result.output
    assert "own head: mimo-llm:1 ships its own mimo MTP head" in " ".join(result.output.split())


def test_the_answer_says_what_it_assumed_and_reads_task_names_of_either_vocabulary():
    argv = ["recommend", "--params", "8B", "--gpus", "1", "--gpu-memory-gb", "80", "--tpot-ms", "30", "--task", "prose"]
    result = CliRunner().invoke(_cli(), argv)
    assert result.exit_code == 0, result.output
    headline = result.output.splitlines()[0]
    assert "8B target" in headline and "batch 1; --batch for batched serving" in headline and "task chat" in headline
    small = CliRunner().invoke(_cli(), [*argv[:2], "0.00426214B", *argv[3:]])
    assert "4.26M target" in small.output and "0.00426214B" not in small.output


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--params", "8B", "--gpus", "1000000", "--gpu-memory-gb", "80"], "beyond any real deployment"),
        (["--params", "8B", "--gpus", "1", "--gpu-memory-gb", "1e308"], "beyond any real deployment"),
        (["--params", "8B", "--gpus", "1", "--gpu-memory-gb", "inf"], "must be a positive number"),
        (["--target", "demo-llm:-1", "--gpus", "1", "--gpu-memory-gb", "80"], "is not a version number"),
        (["--target", "demo-llm:abc", "--gpus", "1", "--gpu-memory-gb", "80"], "is not a version number"),
    ],
)
def test_impossible_hardware_and_bad_versions_are_refused_not_answered(argv, says, tmp_path):
    result = CliRunner().invoke(_cli(), ["recommend", *argv, "--tpot-ms", "30", "--task", "chat"])
    assert result.exit_code != 0 and says in str(result.exception), (result.output, result.exception)


def test_an_unknown_target_is_named_as_unknown_not_as_lacking_an_alias(workdir):
    """It said the target had no production alias and told the user to give a version of a model that is not there."""
    argv = ["--target", "no-such-llm", "--gpus", "1", "--gpu-memory-gb", "80", "--tpot-ms", "30", "--task", "chat"]
    result = CliRunner().invoke(_cli(), ["recommend", *argv])
    assert isinstance(result.exception, DraftsyncError)
    assert "holds no registered model named 'no-such-llm'" in result.exception.what
    assert "--params" in result.exception.fix
