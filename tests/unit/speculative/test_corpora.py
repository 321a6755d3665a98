"""The standard library's documents are parsed once per machine and read back from the user's cache after that."""

from __future__ import annotations

import pytest
from draftsync.speculative.data import corpora
from draftsync.speculative.data.corpora import Document

PARSED = (
    (Document("code", "json/__init__.py#dumps-3", 'def dumps(obj):\n    return "\\u00e9\\n"  # é'),),
    (Document("prose", "LICENSE.txt#0", "Permission is hereby granted, free of charge ..."),),
)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    corpora._stdlib_documents.cache_clear()
    yield tmp_path
    corpora._stdlib_documents.cache_clear()


def _parses(monkeypatch, result) -> list[int]:
    calls: list[int] = []

    def parse():
        calls.append(1)
        return result

    monkeypatch.setattr(corpora, "_parse_stdlib_documents", parse)
    return calls


def test_documents_parsed_once_are_read_back_from_the_cache_file_as_they_were(cache_home, monkeypatch):
    calls = _parses(monkeypatch, PARSED)
    assert corpora._stdlib_documents() == PARSED
    assert corpora._documents_cache_file().parent == cache_home / "draftsync"
    assert corpora._documents_cache_file().exists()

    corpora._stdlib_documents.cache_clear()  # a new process
    assert corpora._stdlib_documents() == PARSED
    assert len(calls) == 1


def test_a_cache_file_that_does_not_read_is_parsed_again_and_replaced(cache_home, monkeypatch):
    calls = _parses(monkeypatch, PARSED)
    cache = corpora._documents_cache_file()
    cache.parent.mkdir(parents=True)
    cache.write_text('{"code": [["code", "trunc')  # a write cut short

    assert corpora._stdlib_documents() == PARSED
    corpora._stdlib_documents.cache_clear()
    assert corpora._stdlib_documents() == PARSED
    assert len(calls) == 1


def test_a_home_that_cannot_be_written_still_gets_its_documents(cache_home, monkeypatch):
    (cache_home / "draftsync").write_text("a file where the cache directory would go")
    calls = _parses(monkeypatch, PARSED)
    assert corpora._stdlib_documents() == PARSED
    corpora._stdlib_documents.cache_clear()
    assert corpora._stdlib_documents() == PARSED
    assert len(calls) == 2


def test_distinct_prompts_are_each_drawn_once_and_never_more_than_the_documents_hold():
    from draftsync.speculative.data.corpora import task_prompts_for_mix

    mix = {"code": 0.5, "math": 0.3, "prose": 0.2}
    drawn = task_prompts_for_mix(mix, 50_000, seed=100, split="train")
    distinct = task_prompts_for_mix(mix, 50_000, seed=100, split="train", distinct=True)
    assert len(set(drawn)) == len(distinct) < len(drawn)  # with replacement, most of 50,000 repeat
    assert distinct == list(dict.fromkeys(drawn))  # the same draw, each prompt at its first place
