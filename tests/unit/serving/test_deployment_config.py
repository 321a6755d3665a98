"""Deployments read from YAML: the documented example loads, and every kind of mistake is one clear error."""

from __future__ import annotations

import json
import re
import textwrap

import draftsync.serving.deployment as deployment_module
import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.deployment import ServingDeployment, find_deployment, load_deployments


def write(tmp_path, text: str, name: str = "deployments.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(tmp_path, text: str) -> DraftsyncError:
    path = write(tmp_path, text)
    with pytest.raises(DraftsyncError) as raised:
        load_deployments(path)
    assert str(path) in raised.value.what
    return raised.value


def test_the_documented_example_loads(tmp_path):
    example = re.search(r"```yaml\n(.*?)```", deployment_module.__doc__, re.S).group(1)
    chat, demo, k8s = load_deployments(write(tmp_path, example))
    assert (chat.name, chat.target_name, chat.target_alias, chat.launch) == ("chat", "llama-chat", "production", "vllm")
    assert chat.task_mix == {"code": 0.7, "math": 0.3} and chat.tpot_target_ms == 25.0
    assert (chat.host, chat.port, chat.tensor_parallel_size) == ("0.0.0.0", 8000, 2)
    assert chat.extra_vllm_args == ["--max-model-len", "8192", "--gpu-memory-utilization", "0.90"]
    assert (demo.launch, demo.port, demo.host, demo.endpoint) == ("reference", 8100, "127.0.0.1", None)
    assert (k8s.launch, k8s.endpoint) == ("external", "http://chat.serving.svc:8000")


def test_defaults_match_the_model(tmp_path):
    (only,) = load_deployments(
        write(
            tmp_path,
            """
        deployments:
          - name: pair
            target_name: pair-llm
    """,
        )
    )
    assert only == ServingDeployment(name="pair", target_name="pair-llm")
    assert (only.launch, only.target_alias, only.tpot_target_ms) == ("reference", "production", None)
    assert only.temperature == 0.0
    assert only.extra_vllm_args == [] and only.endpoint is None


def test_a_deployment_renders_its_vllm_launch(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSYNC_MODEL_ROOTS", "/models")  # made-up checkpoints: the launch is rendered, not run
    (chat,) = load_deployments(
        write(
            tmp_path,
            """
        deployments:
          - name: chat
            target_name: llama-chat
            launch: vllm
            host: 0.0.0.0
            port: 8000
            tensor_parallel_size: 2
            extra_vllm_args: [--max-model-len, "4096"]
    """,
        )
    )
    launch = chat.vllm_launch(
        "/models/target", "/models/drafter", "eagle3", 4, schedule=[(1, 8, 4), (9, 64, 2)], port=8123
    )
    argv = launch.argv
    assert argv[:3] == ["vllm", "serve", "/models/target"]
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--served-model-name") + 1] == "chat"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and argv[-2:] == ["--max-model-len", "4096"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "eagle3",
        "model": "/models/drafter",
        "num_speculative_tokens": 4,
        "draft_tensor_parallel_size": 2,
        "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 2]],
    }
    plain = chat.vllm_launch("/models/target", None, "eagle3", 4).argv
    assert plain[plain.index("--port") + 1] == "8000" and "--speculative-config" not in plain


def test_a_deployment_chooses_how_vllm_samples_drafts(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSYNC_MODEL_ROOTS", "/models")
    (chat,) = load_deployments(
        write(
            tmp_path,
            """
        deployments:
          - {name: chat, target_name: llama-chat, launch: vllm, temperature: 0.8, draft_sampling: probabilistic}
    """,
        )
    )
    argv = chat.vllm_launch("/models/target", "/models/drafter", "eagle3", 3).argv
    assert json.loads(argv[argv.index("--speculative-config") + 1])["draft_sample_method"] == "probabilistic"
    ngram = chat.vllm_launch("/models/target", None, "ngram", 3).argv  # drafts from the prompt: no draft sampling
    assert "draft_sample_method" not in json.loads(ngram[ngram.index("--speculative-config") + 1])
    assert "draft_sample_method" not in " ".join(
        chat.model_copy(update={"draft_sampling": None})
        .vllm_launch("/models/target", "/models/drafter", "eagle3", 3)
        .argv
    )  # unset: vLLM's default


def test_the_pairs_draft_sampling_renders_where_the_deployment_sets_none(monkeypatch):
    """A rollout passes the draft sampling validation measured better; the deployment's own is rendered otherwise."""
    from draftsync.serving.deployment import ServingDeployment

    monkeypatch.setenv("DRAFTSYNC_MODEL_ROOTS", "/models")
    chat = ServingDeployment(name="chat", target_name="llama-chat", launch="vllm", temperature=1.0)
    argv = chat.vllm_launch("/models/target", "/models/drafter", "eagle3", 3, draft_sampling="probabilistic").argv
    assert json.loads(argv[argv.index("--speculative-config") + 1])["draft_sample_method"] == "probabilistic"
    assert "draft_sample_method" not in " ".join(
        chat.vllm_launch("/models/target", "/models/drafter", "eagle3", 3).argv
    )


def test_an_unknown_key_names_the_file_deployment_field_and_spelling(tmp_path):
    error = load_error(
        tmp_path,
        """
        deployments:
          - name: chat
            target_name: llama-chat
            tpot_target: 25
    """,
    )
    assert "deployment 'chat' (entry 1): field 'tpot_target' is not a deployment field" in error.what
    assert "did you mean 'tpot_target_ms'" in error.what
    assert "remove 'tpot_target'" in error.fix and "tpot_target_ms" in error.fix


@pytest.mark.parametrize(
    "field, value, complaint",
    [
        ("port", "70000", "less than or equal to 65535"),
        ("temperature", "-0.5", "greater than or equal to 0"),
        ("temperature", ".nan", "finite number"),
        ("tpot_target_ms", "0", "greater than 0"),
        ("launch", "kubernetes", "'reference', 'vllm' or 'external'"),
        ("tensor_parallel_size", "0", "greater than or equal to 1"),
        ("host", "http://gpu-1", "should match pattern"),
        ("target_alias", "'prod alias'", "should match pattern"),
        ("task_mix", "{code: 1, chat: 1}", "tasks \\['chat'\\] are not among"),
        ("task_mix", "{code: -1, math: 0}", "not >= 0 with at least one above 0"),
        ("extra_vllm_args", "[--port, '9000']", "set flags that draftsync sets itself"),
        ("extra_vllm_args", "[-tp, '4']", "set flags that draftsync sets itself"),
        ("extra_vllm_args", "['--speculative-config.num_speculative_tokens', '8']", "set flags that draftsync sets"),
        ("extra_vllm_args", "[--max-model-len, 4096]", "valid string"),
        # the plan reads this one for the GPU memory the deployment holds: it was a bare ValueError there
        ("extra_vllm_args", "[--gpu-memory-utilization, abc]", "'abc' is not a fraction of a GPU's memory"),
        ("extra_vllm_args", "['--gpu-memory-utilization=1.5']", "'1.5' is not a fraction"),
        ("extra_vllm_args", "[--gpu-memory-utilization, nan]", "'nan' is not a fraction"),
    ],
)
def test_a_bad_value_names_the_deployment_and_field(tmp_path, field, value, complaint):
    error = load_error(
        tmp_path,
        f"""
        deployments:
          - name: chat
            target_name: llama-chat
            {field}: {value}
    """,
    )
    where = rf"deployment 'chat' \(entry 1\): field '{field}(\.[^']+)?': "
    assert re.search(where + f".*{complaint}", error.what), error.what
    assert error.fix


def test_external_needs_an_http_endpoint_and_the_others_refuse_one(tmp_path):
    missing = load_error(
        tmp_path,
        """
        deployments:
          - {name: k8s, target_name: t, launch: external}
    """,
    )
    assert "field 'endpoint': launch external needs the endpoint" in missing.what
    assert "http://HOST:PORT" in missing.fix
    not_http = load_error(
        tmp_path,
        """
        deployments:
          - {name: k8s, target_name: t, launch: external, endpoint: "chat.svc:8000"}
    """,
    )
    assert "is not an http(s) URL" in not_http.what
    stray = load_error(
        tmp_path,
        """
        deployments:
          - {name: local, target_name: t, launch: vllm, endpoint: "http://x:1"}
    """,
    )
    assert "endpoint is set but launch is 'vllm'" in stray.what
    (ok,) = load_deployments(
        write(
            tmp_path,
            """
        deployments:
          - {name: k8s, target_name: t, launch: external, endpoint: "https://chat.svc:8443/"}
    """,
        )
    )
    assert ok.endpoint == "https://chat.svc:8443"


def test_duplicate_names_are_refused_with_both_entries(tmp_path):
    error = load_error(
        tmp_path,
        """
        deployments:
          - {name: chat, target_name: a}
          - {name: code, target_name: b}
          - {name: chat, target_name: c}
    """,
    )
    assert "deployment 'chat': field 'name' is declared 2 times (entries 1, 3)" in error.what
    assert "its own name" in error.fix


def test_every_problem_in_the_file_comes_back_in_one_error(tmp_path):
    error = load_error(
        tmp_path,
        """
        deployments:
          - name: chat
            target_name: llama-chat
            port: -1
            colour: blue
          - name: chat
            launch: vllm
          - 5
    """,
    )
    assert "has 5 problems" in error.what
    for expected in (
        "'chat' (entry 1): field 'port'",
        "'chat' (entry 1): field 'colour'",
        "'chat' (entry 2): field 'target_name' is required",
        "entry 3 (no valid name) is int 5",
        "field 'name' is declared 2 times",
    ):
        assert expected in error.what
    assert error.what.count("fix:") == 5


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("", "is empty"),
        ("- {name: chat, target_name: t}\n", "no top-level `deployments` key"),
        ("deployments: []\n", "not a non-empty list"),
        ("deployments:\n  - {name: a, target_name: t}\nsettings: {}\n", "unknown top-level keys \\['settings'\\]"),
        ("deployments:\n  - name: [unclosed\n", "not valid YAML at line 3"),
    ],
)
def test_a_file_of_the_wrong_shape_says_what_shape_to_write(tmp_path, text, complaint):
    error = load_error(tmp_path, text)
    assert re.search(complaint, error.what), error.what
    assert error.fix


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DraftsyncError, match="does not exist") as raised:
        load_deployments(tmp_path / "nowhere.yaml")
    assert "nowhere.yaml" in raised.value.what


def test_find_deployment_lists_the_known_names():
    deployments = [ServingDeployment(name="chat", target_name="a"), ServingDeployment(name="code", target_name="b")]
    assert find_deployment(deployments, "code") is deployments[1]
    with pytest.raises(
        DraftsyncError, match="no deployment is called 'chta' \\(did you mean 'chat'\\?\\); known: chat, code"
    ):
        find_deployment(deployments, "chta")
    with pytest.raises(DraftsyncError, match="known: none"):
        find_deployment([], "chat")
