"""Chat on real vLLM through a deployment's router, as an OpenAI client of the demo's deployment talks to it: the
built-in target's chat template (its chat_template.jinja) is what vLLM renders a conversation with, streamed or not.

One vLLM start: target v1 of the test size (shipped, copied through the test cache) served alone, behind the router
the rollout puts in front of it (ServerBook.launch, then switch: what `draftsync rollout` does).
"""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.vllm

DEPLOYMENT = "chat-test"
MAX_TOKENS = 24
CONVERSATION = [
    {"role": "user", "content": "What is 6 times 7?"},
    {"role": "assistant", "content": "6 * 7 = 42."},
    {"role": "user", "content": "How many apples are 3 bags of 4 apples?"},
]


@pytest.fixture(scope="module")
def router(vllm_engine, built_targets, tmp_path_factory):
    """The router's URL, forwarding to vLLM serving target v1 alone; both are stopped afterwards."""
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.serving.servers import PairLaunch, ServerBook

    book = ServerBook(tmp_path_factory.mktemp("chat-serving"))
    deployment = ServingDeployment(name=DEPLOYMENT, target_name="builtin-test", launch="vllm")
    launched = book.launch(deployment, PairLaunch(str(built_targets[1]), None, 0, None))
    try:
        switched = book.switch(deployment, launched, capture=None)
    except BaseException:
        book.stop_candidate(launched)
        raise
    try:
        yield switched.endpoint
    finally:
        book.stop(DEPLOYMENT)


@pytest.fixture(scope="module")
def prompt_tokens(built_targets) -> int:
    """The conversation's length in tokens as the target's own template renders it, generation prompt included."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(built_targets[1]))
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _request(**extra) -> dict:
    return {"model": DEPLOYMENT, "messages": CONVERSATION, "max_tokens": MAX_TOKENS, "temperature": 0.0, **extra}


def _check_usage(usage: dict, prompt_tokens: int) -> None:
    # vLLM counts the prompt our template renders: the same template, not a default one
    assert usage["prompt_tokens"] == prompt_tokens
    assert 0 < usage["completion_tokens"] <= MAX_TOKENS
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_chat_completions_answer_through_the_router(router, prompt_tokens):
    with httpx.Client(base_url=router, timeout=300) as client:
        response = client.post("/v1/chat/completions", json=_request())
    assert response.status_code == 200, response.text[:500]
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["model"] == DEPLOYMENT
    (choice,) = answer["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].strip(), answer
    assert choice["finish_reason"] in ("stop", "length")
    _check_usage(answer["usage"], prompt_tokens)
    print(f"\nchat answer (not streamed): {choice['message']['content']!r} usage {answer['usage']}")


def test_streamed_chat_completions_end_with_their_usage(router, prompt_tokens):
    with httpx.Client(base_url=router, timeout=300) as client:
        body = _request(stream=True, stream_options={"include_usage": True})
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200, response.read().decode()[:500]
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    *answering, last = chunks
    assert last["choices"] == [] and last["usage"] is not None  # include_usage: one chunk of usage, at the end
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in answering if c["choices"])
    assert content.strip(), chunks
    _check_usage(last["usage"], prompt_tokens)
    print(f"\nchat answer (streamed, {len(answering)} chunks): {content!r} usage {last['usage']}")
