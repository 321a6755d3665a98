"""Training samples for a shard build, and the sources that stream them.

A source is re-iterable, has a fixed length and can start at any position without producing the
samples before it, so a resumed build skips what its completed shards consumed instead of
re-tokenizing or regenerating it. Each source carries a fingerprint of its inputs, which the
manifest records so a resume can tell it is fed the same data.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from draftsync.errors import DraftsyncError


@dataclass(frozen=True)
class Sample:
    """One training sequence: its task, its token ids and which of them are training targets."""

    task: str
    input_ids: list[int]
    loss_mask: list[int]


# --- sample streams --------------------------------------------------------------------------------
class SampleSource:
    """A re-iterable, fixed-length stream of samples that can start anywhere without producing the rest.

    `fingerprint` identifies the inputs, so a resumed build can tell whether it is fed the same data.
    """

    mode = "custom"
    writer: str | None = None  # the engine that wrote the source's responses; None: it has none

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        raise NotImplementedError

    def iter_from(self, start: int) -> Iterator[Sample]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Sample]:
        return self.iter_from(0)


def _tokenizer_identity(tokenizer: Any) -> str:
    return (
        f"{type(tokenizer).__name__}:{len(tokenizer)}:{tokenizer.eos_token_id}:{getattr(tokenizer, 'name_or_path', '')}"
    )


def _digest_of(parts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8", errors="surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


class _TeacherForced(SampleSource):
    mode = "teacher_forced"

    def __init__(self, tokenizer: Any, pairs: Sequence[tuple[str, str]], chunk: int):
        if tokenizer.eos_token_id is None:
            raise DraftsyncError(
                "the tokenizer has no EOS token", "use the target's own tokenizer (it defines eos_token)"
            )
        self.tokenizer, self.pairs, self.chunk = tokenizer, list(pairs), chunk

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def fingerprint(self) -> str:
        return _digest_of(
            itertools.chain(
                [self.mode, _tokenizer_identity(self.tokenizer)], (f"{task}\x01{text}" for task, text in self.pairs)
            )
        )

    def iter_from(self, start: int) -> Iterator[Sample]:
        eos = self.tokenizer.eos_token_id
        for begin in range(start, len(self.pairs), self.chunk):
            part = self.pairs[begin : begin + self.chunk]
            encoded = self.tokenizer([text for _, text in part])["input_ids"]
            for (task, _), ids in zip(part, encoded, strict=True):
                ids = list(ids) + [eos]
                yield Sample(task, ids, [1] * len(ids))


class _Regenerated(SampleSource):
    mode = "regenerated"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        task_prompts: Sequence[tuple[str, str]],
        max_new_tokens: int,
        batch_size: int,
        temperature: float,
        seed: int,
        writer: str,
        open_writer: Callable[[], Any] | None,
    ):
        from draftsync.speculative.data.responses import WRITERS

        if writer not in WRITERS:
            raise DraftsyncError(f"unknown response writer {writer!r}", f"use one of {', '.join(WRITERS)}")
        if writer == "vllm" and open_writer is None:
            raise DraftsyncError(
                "vLLM-written responses need the writer that starts the target's server",
                "pass open_writer=lambda: VllmResponseWriter(target_dir, log_dir) "
                "(draftsync.serving.vllm_responses) to regenerated_samples",
            )
        self.model, self.tokenizer, self.task_prompts = model, tokenizer, list(task_prompts)
        self.max_new_tokens, self.batch_size, self.temperature, self.seed = (
            max_new_tokens,
            batch_size,
            temperature,
            seed,
        )
        self.writer, self.open_writer = writer, open_writer

    def __len__(self) -> int:
        return len(self.task_prompts)

    @property
    def fingerprint(self) -> str:
        settings = f"{self.mode}:{self.max_new_tokens}:{self.batch_size}:{self.temperature}:{self.seed}:{self.writer}"
        return _digest_of(
            itertools.chain(
                [settings, _tokenizer_identity(self.tokenizer)],
                (f"{task}\x01{prompt}" for task, prompt in self.task_prompts),
            )
        )

    def iter_from(self, start: int) -> Iterator[Sample]:
        return self._vllm_from(start) if self.writer == "vllm" else self._hf_from(start)

    def _hf_from(self, start: int) -> Iterator[Sample]:
        from draftsync.speculative.data.responses import generate_responses

        # Generation batches sit at fixed positions with their own seed, so starting mid-way produces the
        # same samples as a run from the beginning (padding and sampling depend only on the batch).
        first = start // self.batch_size
        for index in range(first, -(-len(self.task_prompts) // self.batch_size)):
            part = self.task_prompts[index * self.batch_size : (index + 1) * self.batch_size]
            sequences, masks = generate_responses(
                self.model,
                self.tokenizer,
                [prompt for _, prompt in part],
                self.max_new_tokens,
                batch_size=len(part),
                temperature=self.temperature,
                seed=self.seed + index,
            )
            skip = start - index * self.batch_size if index == first else 0
            for (task, _), ids, mask in list(zip(part, sequences, masks, strict=True))[skip:]:
                yield Sample(task, ids, mask)

    def _vllm_from(self, start: int) -> Iterator[Sample]:
        # Each response has its own seed by position, so a resumed build samples what a run from the start did.
        part = self.task_prompts[start:]
        if not part:
            return
        assert self.open_writer is not None  # checked in __init__
        with self.open_writer() as writer:
            answers = writer.responses(
                self.tokenizer,
                (prompt for _, prompt in part),
                self.max_new_tokens,
                temperature=self.temperature,
                seed=self.seed,
                first=start,
            )
            for (task, _), (ids, mask) in zip(part, answers, strict=True):
                yield Sample(task, ids, mask)


class _Concatenated(SampleSource):
    def __init__(self, sources: Sequence[SampleSource]):
        self.sources = list(sources)
        self.mode = "+".join(dict.fromkeys(source.mode for source in self.sources))
        self.writer = "+".join(dict.fromkeys(s.writer for s in self.sources if s.writer)) or None

    def __len__(self) -> int:
        return sum(len(source) for source in self.sources)

    @property
    def fingerprint(self) -> str:
        return _digest_of(source.fingerprint for source in self.sources)

    def iter_from(self, start: int) -> Iterator[Sample]:
        for source in self.sources:
            size = len(source)
            if start < size:
                yield from source.iter_from(start)
            start = max(0, start - size)


def teacher_forced_samples(tokenizer: Any, pairs: Sequence[tuple[str, str]], chunk: int = 256) -> SampleSource:
    """(task, text) pairs as samples: the text's tokens plus EOS, every token a training target.

    Texts are tokenized `chunk` at a time while the build consumes them.
    """
    return _TeacherForced(tokenizer, pairs, chunk)


def regenerated_samples(
    model: Any,
    tokenizer: Any,
    task_prompts: Sequence[tuple[str, str]],
    max_new_tokens: int,
    batch_size: int = 32,
    temperature: float = 0.0,
    seed: int = 0,
    writer: str = "hf",
    open_writer: Callable[[], Any] | None = None,
) -> SampleSource:
    """(task, prompt) pairs answered by the target itself: prompt + response, loss on the response only.

    Responses are generated as the build consumes them: by `model` one batch of prompts at a time (writer "hf"),
    or (writer "vllm") by the writer `open_writer()` returns, a context manager with `responses(...)` such as
    `draftsync.serving.vllm_responses.VllmResponseWriter`: entered when the build reaches the first response and
    left when it has the last.
    """
    return _Regenerated(
        model, tokenizer, task_prompts, max_new_tokens, batch_size, temperature, seed, writer, open_writer
    )


def concat_samples(*sources: SampleSource) -> SampleSource:
    """One stream of several sources in order (e.g. teacher-forced texts, then regenerated responses)."""
    return _Concatenated(sources)


RESPONSES_FILE = "responses.json"


class StoredResponses:
    """Responses written before the build loads the target, served back in order as a writer of `regenerated_samples`
    serves them. A sync's vLLM response server needs its GPUs to itself (the plan sizes it so), so its responses are
    all written, and the server stopped, before the transformers target takes the same GPUs."""

    def __init__(self, answers: list[tuple[list[int], list[int]]]):
        self.answers = answers

    def __enter__(self) -> StoredResponses:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def responses(
        self,
        tokenizer: Any,
        prompts: Iterable[str],
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
        first: int = 0,
    ) -> Iterator[tuple[list[int], list[int]]]:
        return iter(self.answers[first:])


def responses_written_first(source: SampleSource, out_dir: Any) -> StoredResponses:
    """Every response of `source` (a regenerated source whose writer starts its own server), written to
    `out_dir/responses.json` with the source's fingerprint, so a resumed build reads them back instead of starting
    the server again; a file of other inputs is written anew."""
    import json
    from pathlib import Path

    from draftsync.files import atomic_write

    path = Path(out_dir) / RESPONSES_FILE
    if path.exists():
        stored = json.loads(path.read_text())
        if stored.get("fingerprint") == source.fingerprint and len(stored["answers"]) == len(source):
            return StoredResponses([(ids, mask) for ids, mask in stored["answers"]])
    answers = [(sample.input_ids, sample.loss_mask) for sample in source]
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"fingerprint": source.fingerprint, "answers": answers})
    atomic_write(path, lambda tmp: tmp.write_text(text))
    return StoredResponses(answers)
