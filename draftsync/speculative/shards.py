"""Hidden-state shards: the target is run once over the training set and its states are kept on disk.

Training then streams states from disk instead of running the target at every step, so a drafter can
train for many epochs, and a new method can be tried on the same data, at the cost of one target pass.

On disk, a directory holds `manifest.json`, `token_counts.safetensors` and `shard-NNNNN.safetensors`.
Each shard concatenates its sequences' tokens flat:

    input_ids  int32 [N]        loss_mask  bool [N]          offsets  int64 [n+1] (sequence i is offsets[i]:offsets[i+1])
    task_index int16 [n]        aux  bf16/fp16 [N, 3H]       final    bf16/fp16 [N, H] (post-norm last state)

(`aux` is absent when the dataset was built without it.) States are never stored in fp32: they are
half the disk and page-cache traffic in 16 bits, and drafters train on them in fp32 after loading.

The build is streaming (one shard's worth of states in memory, plus one batch) and resumable: the
manifest is rewritten atomically after each shard and is the only commit point, so a rerun with the
same inputs skips the samples that completed shards consumed and rewrites anything after them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.hidden_states import capture, num_decoder_layers, validate_aux_layer_ids
from draftsync.speculative.training_batch import TrainingBatch

FORMAT = "draftsync-hidden-states"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
TOKEN_COUNTS_FILE = "token_counts.safetensors"
MIN_WINDOW_TOKENS = 3  # a window needs a state, a next token and one token after it to train on
_STATE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


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
    return f"{type(tokenizer).__name__}:{len(tokenizer)}:{tokenizer.eos_token_id}:{getattr(tokenizer, 'name_or_path', '')}"


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
            raise DraftsyncError("the tokenizer has no EOS token", "use the target's own tokenizer (it defines eos_token)")
        self.tokenizer, self.pairs, self.chunk = tokenizer, list(pairs), chunk

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def fingerprint(self) -> str:
        return _digest_of(itertools.chain([self.mode, _tokenizer_identity(self.tokenizer)],
                                          (f"{task}\x01{text}" for task, text in self.pairs)))

    def iter_from(self, start: int) -> Iterator[Sample]:
        eos = self.tokenizer.eos_token_id
        for begin in range(start, len(self.pairs), self.chunk):
            part = self.pairs[begin : begin + self.chunk]
            encoded = self.tokenizer([text for _, text in part])["input_ids"]
            for (task, _), ids in zip(part, encoded):
                ids = list(ids) + [eos]
                yield Sample(task, ids, [1] * len(ids))


class _Regenerated(SampleSource):
    mode = "regenerated"

    def __init__(self, model: Any, tokenizer: Any, task_prompts: Sequence[tuple[str, str]], max_new_tokens: int,
                 batch_size: int, temperature: float, seed: int):
        self.model, self.tokenizer, self.task_prompts = model, tokenizer, list(task_prompts)
        self.max_new_tokens, self.batch_size, self.temperature, self.seed = max_new_tokens, batch_size, temperature, seed

    def __len__(self) -> int:
        return len(self.task_prompts)

    @property
    def fingerprint(self) -> str:
        settings = f"{self.mode}:{self.max_new_tokens}:{self.batch_size}:{self.temperature}:{self.seed}"
        return _digest_of(itertools.chain([settings, _tokenizer_identity(self.tokenizer)],
                                          (f"{task}\x01{prompt}" for task, prompt in self.task_prompts)))

    def iter_from(self, start: int) -> Iterator[Sample]:
        from draftsync.speculative.responses import generate_responses

        # Generation batches sit at fixed positions with their own seed, so starting mid-way produces the
        # same samples as a run from the beginning (padding and sampling depend only on the batch).
        first = start // self.batch_size
        for index in range(first, -(-len(self.task_prompts) // self.batch_size)):
            part = self.task_prompts[index * self.batch_size : (index + 1) * self.batch_size]
            sequences, masks = generate_responses(
                self.model, self.tokenizer, [prompt for _, prompt in part], self.max_new_tokens,
                batch_size=len(part), temperature=self.temperature, seed=self.seed + index,
            )
            skip = start - index * self.batch_size if index == first else 0
            for (task, _), ids, mask in list(zip(part, sequences, masks))[skip:]:
                yield Sample(task, ids, mask)


class _Concatenated(SampleSource):
    def __init__(self, sources: Sequence[SampleSource]):
        self.sources = list(sources)
        self.mode = "+".join(dict.fromkeys(source.mode for source in self.sources))

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
) -> SampleSource:
    """(task, prompt) pairs answered by the target itself: prompt + response, loss on the response only.

    Responses are generated one batch of prompts at a time, as the build consumes them.
    """
    return _Regenerated(model, tokenizer, task_prompts, max_new_tokens, batch_size, temperature, seed)


def concat_samples(*sources: SampleSource) -> SampleSource:
    """One stream of several sources in order (e.g. teacher-forced texts, then regenerated responses)."""
    return _Concatenated(sources)


# --- building -------------------------------------------------------------------------------------
def target_fingerprint(model: Any) -> str:
    """A cheap identity of the target's weights: names, shapes and the first values of every tensor."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            digest.update(f"{name}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.detach().reshape(-1)[:64].to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()[:32]


def _target_facts(model: Any, target_name: str | None) -> dict:
    config = model.config
    return {
        "name_or_path": target_name or getattr(config, "_name_or_path", "") or "",
        "architecture": (getattr(config, "architectures", None) or [type(model).__name__])[0],
        "hidden_size": int(config.hidden_size),
        "num_layers": num_decoder_layers(model),
        "vocab_size": int(config.vocab_size),
        "fingerprint": target_fingerprint(model),
    }


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _write_json(path: Path, payload: dict) -> None:
    _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=2)))


def _write_token_counts(path: Path, counts: torch.Tensor) -> None:
    from safetensors.torch import save_file

    _atomic_write(path, lambda tmp: save_file({"token_counts": counts.contiguous()}, str(tmp)))


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def _chain_digest(previous: str, sample: Sample) -> str:
    """Running digest of every sample consumed so far: a resumed build checks it is fed the same inputs."""
    digest = hashlib.sha256(previous.encode())
    digest.update(sample.task.encode())
    digest.update(torch.tensor(sample.input_ids, dtype=torch.int64).numpy().tobytes())
    digest.update(bytes(1 if m else 0 for m in sample.loss_mask))
    return digest.hexdigest()


class _ShardBuffer:
    """Sequences waiting to be written as one shard, in preallocated tensors of the on-disk dtypes.

    Filling preallocated rows (pages are touched only as rows are written) keeps the peak at one shard,
    where collecting per-sequence tensors and concatenating them would briefly need two.
    """

    def __init__(self, capacity: int, hidden: int, aux_width: int, dtype: torch.dtype):
        self.input_ids = torch.empty(capacity, dtype=torch.int32)
        self.loss_mask = torch.empty(capacity, dtype=torch.bool)
        self.aux = torch.empty(capacity, aux_width, dtype=dtype) if aux_width else None
        self.final = torch.empty(capacity, hidden, dtype=dtype)
        self.lengths: list[int] = []
        self.tasks: list[int] = []
        self.tokens = 0

    def add(self, ids: torch.Tensor, mask: torch.Tensor, task: int, aux: torch.Tensor | None, final: torch.Tensor):
        begin, end = self.tokens, self.tokens + ids.shape[0]
        self.input_ids[begin:end] = ids
        self.loss_mask[begin:end] = mask
        if self.aux is not None:
            self.aux[begin:end] = aux
        self.final[begin:end] = final
        self.lengths.append(end - begin)
        self.tasks.append(task)
        self.tokens = end

    def tensors(self) -> dict[str, torch.Tensor]:
        used = self.tokens
        out = {
            "input_ids": self.input_ids[:used],
            "loss_mask": self.loss_mask[:used],
            "offsets": torch.cumsum(torch.tensor([0] + self.lengths, dtype=torch.int64), 0),
            "task_index": torch.tensor(self.tasks, dtype=torch.int16),
            "final": self.final[:used],
        }
        if self.aux is not None:
            out["aux"] = self.aux[:used]
        return out


def _new_manifest(facts: dict, layer_ids: tuple[int, ...], dtype_name: str, store_aux: bool, mode: str,
                  fingerprint: str | None, shard_tokens: int, batch_size: int, max_batch_tokens: int,
                  max_seq_len: int | None) -> dict:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "complete": False,
        "target": facts,
        "aux_layer_ids": list(layer_ids),
        "store_aux": store_aux,
        "dtype": dtype_name,
        "mode": mode,
        "source_fingerprint": fingerprint,
        "shard_tokens": shard_tokens,
        "batch_size": batch_size,
        "max_batch_tokens": max_batch_tokens,
        "max_seq_len": max_seq_len,
        "samples_consumed": 0,
        "samples_digest": "",
        "skipped_samples": {"too_short": 0, "no_loss_tokens": 0},
        "truncated_samples": 0,
        "task_names": [],
        "tasks": {},
        "num_sequences": 0,
        "total_tokens": 0,
        "loss_tokens": 0,
        "token_counts_file": TOKEN_COUNTS_FILE,
        "shards": [],
    }


# Fields a resumed build must share with the directory it continues: anything else would mix datasets.
_RESUME_FIELDS = ("format_version", "aux_layer_ids", "store_aux", "dtype", "mode", "source_fingerprint",
                  "shard_tokens", "batch_size", "max_batch_tokens", "max_seq_len")
_TARGET_FIELDS = ("hidden_size", "num_layers", "vocab_size", "fingerprint")


def _check_resumable(out_dir: Path, old: dict, new: dict) -> None:
    fix = f"build into a fresh directory, or delete {out_dir} to rebuild it"
    if old.get("format") != FORMAT:
        raise DraftsyncError(f"{out_dir} holds a {MANIFEST_FILE} that is not a hidden-state dataset", fix)
    for key in _TARGET_FIELDS:
        if old["target"].get(key) != new["target"][key]:
            raise DraftsyncError(
                f"{out_dir} was built for another target ({key} {old['target'].get(key)!r}, "
                f"this target has {new['target'][key]!r}; built from {old['target'].get('name_or_path')!r})", fix)
    for key in _RESUME_FIELDS:
        if old.get(key) != new[key]:
            raise DraftsyncError(
                f"{out_dir} was built with {key}={old.get(key)!r}, this build asks for {key}={new[key]!r}", fix)


def _recount_tokens(out_dir: Path, manifest: dict, vocab_size: int) -> torch.Tensor:
    """Token counts of the completed shards, read back: the counts file may be newer than the manifest."""
    from safetensors import safe_open

    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for shard in manifest["shards"]:
        with safe_open(str(out_dir / shard["file"]), framework="pt") as handle:
            ids = handle.get_tensor("input_ids").to(torch.int64)
            mask = handle.get_tensor("loss_mask").to(torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def _remove_uncommitted(out_dir: Path, manifest: dict) -> None:
    """Delete shards written after the last manifest update (an interrupted build) and leftover temp files."""
    kept = {shard["file"] for shard in manifest["shards"]}
    ours = (MANIFEST_FILE + ".tmp", TOKEN_COUNTS_FILE + ".tmp")
    for path in out_dir.iterdir():
        if path.name in ours or (path.name.startswith("shard-") and path.name not in kept):
            path.unlink()


def _iterate_from(samples: Any, start: int, expected_digest: str) -> Iterator[Sample]:
    """Samples from position `start`; a plain iterable is replayed up to there and checked to be the same."""
    if isinstance(samples, SampleSource):
        yield from samples.iter_from(start)
        return
    iterator = iter(samples)
    digest = ""
    for _ in range(start):
        sample = next(iterator, None)
        if sample is None:
            break
        digest = _chain_digest(digest, sample)
    if start and digest != expected_digest:
        raise DraftsyncError(
            f"the samples given differ from the {start} samples the existing shards were built from",
            "rerun with the same inputs in the same order, or build into a fresh directory",
        )
    yield from iterator


def build_shards(
    model: Any,
    samples: Iterable[Sample],
    out_dir: str | Path,
    aux_layer_ids: Sequence[int],
    *,
    dtype: torch.dtype = torch.bfloat16,
    shard_tokens: int = 65536,
    batch_size: int = 16,
    max_batch_tokens: int = 8192,
    store_aux: bool = True,
    max_seq_len: int | None = None,
    target_name: str | None = None,
    mode: str | None = None,
    on_progress: Any = None,
) -> dict:
    """Run the target over `samples` (a stable order) and write its states as shards; returns the manifest.

    Batches are right-padded and run with causal attention only: a real token never attends to the
    padding after it, so its states equal those of the sequence run alone. Batches sit at fixed sample
    positions and shards close on batch boundaries, so a resumed build writes what an uninterrupted one
    would. Each batch of `batch_size` samples runs as forward passes of at most `max_batch_tokens`
    padded tokens (sequences grouped by length), which bounds activation memory. Samples shorter than 2 tokens or without any loss-masked token are skipped (and counted);
    samples longer than `max_seq_len` (default: the target's max_position_embeddings) are cut there.
    `on_progress(samples_consumed, manifest)` is called after each shard.
    """
    dtype_name = {v: k for k, v in _STATE_DTYPES.items()}.get(dtype)
    if dtype_name is None:
        raise DraftsyncError(f"hidden states cannot be stored as {dtype}", "use torch.bfloat16 or torch.float16")
    if min(shard_tokens, batch_size, max_batch_tokens) < 1:
        raise DraftsyncError(f"shard_tokens={shard_tokens}, batch_size={batch_size}, max_batch_tokens="
                             f"{max_batch_tokens}", "use positive values")
    model.eval()
    layer_ids = validate_aux_layer_ids(aux_layer_ids, num_decoder_layers(model))
    if store_aux and len(layer_ids) != 3:
        raise DraftsyncError(f"{len(layer_ids)} aux layer ids given {list(layer_ids)}",
                             "EAGLE-3 reads exactly three depths; give three ids")
    facts = _target_facts(model, target_name)
    vocab_size = facts["vocab_size"]
    if max_seq_len is None:
        max_seq_len = getattr(model.config, "max_position_embeddings", None)
    source_mode = mode or getattr(samples, "mode", "custom")
    fingerprint = samples.fingerprint if isinstance(samples, SampleSource) else None

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / MANIFEST_FILE
    manifest = _new_manifest(facts, layer_ids, dtype_name, store_aux, source_mode, fingerprint, shard_tokens,
                             batch_size, max_batch_tokens, max_seq_len)
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        _check_resumable(out_dir, old, manifest)
        if old["complete"]:
            return old
        old["target"]["name_or_path"] = facts["name_or_path"]
        manifest = old
        counts = _recount_tokens(out_dir, manifest, vocab_size)
    else:
        if any(out_dir.glob("shard-*.safetensors")):
            raise DraftsyncError(f"{out_dir} holds shards but no {MANIFEST_FILE}", "build into a fresh directory")
        counts = torch.zeros(vocab_size, dtype=torch.int64)
    _remove_uncommitted(out_dir, manifest)

    aux_width = len(layer_ids) * facts["hidden_size"] if store_aux else 0
    writer = _ShardWriter(out_dir, manifest, counts, shard_tokens, aux_width, dtype, on_progress)
    position, digest = manifest["samples_consumed"], manifest["samples_digest"]
    batch = _PendingBatch(position, digest)
    for sample in _iterate_from(samples, position, digest):
        if len(sample.loss_mask) != len(sample.input_ids):
            raise DraftsyncError(
                f"sample {position} ({sample.task}) has {len(sample.input_ids)} tokens but a loss mask of "
                f"{len(sample.loss_mask)}", "give one loss-mask entry per token")
        if sample.input_ids and (min(sample.input_ids) < 0 or max(sample.input_ids) >= vocab_size):
            raise DraftsyncError(
                f"sample {position} ({sample.task}) holds token ids outside the target vocabulary "
                f"(0..{vocab_size - 1})", "tokenize with the target's own tokenizer")
        digest = _chain_digest(digest, sample)
        position += 1
        batch.take(sample, max_seq_len)
        if position % batch_size == 0:
            writer.add_batch(batch, model, layer_ids)
            batch = _PendingBatch(position, digest)
    if position > batch.start:
        writer.add_batch(batch, model, layer_ids)
    if position != manifest["samples_consumed"]:  # states, skips or truncations not yet committed
        writer.commit(position, digest)
    manifest["complete"] = True
    _write_json(out_dir / MANIFEST_FILE, manifest)
    return manifest


class _PendingBatch:
    """Samples of positions [start, start + batch_size): the unit that is run and that shards close after."""

    def __init__(self, start: int, digest_before: str):
        self.start, self.digest_before = start, digest_before
        self.samples: list[Sample] = []
        self.tokens = 0
        self.skipped = {"too_short": 0, "no_loss_tokens": 0}
        self.truncated = 0

    def take(self, sample: Sample, max_seq_len: int | None) -> None:
        if max_seq_len and len(sample.input_ids) > max_seq_len:
            sample = Sample(sample.task, sample.input_ids[:max_seq_len], sample.loss_mask[:max_seq_len])
            self.truncated += 1
        if len(sample.input_ids) < 2:
            self.skipped["too_short"] += 1
        elif not any(sample.loss_mask[1:]):  # the first token is never predicted
            self.skipped["no_loss_tokens"] += 1
        else:
            self.samples.append(sample)
            self.tokens += len(sample.input_ids)


class _ShardWriter:
    """Runs batches through the target into a shard buffer and commits shards with their manifest."""

    def __init__(self, out_dir: Path, manifest: dict, counts: torch.Tensor, shard_tokens: int, aux_width: int,
                 dtype: torch.dtype, on_progress: Any):
        self.out_dir, self.manifest, self.counts = out_dir, manifest, counts
        self.max_batch_tokens = manifest["max_batch_tokens"]
        self.shard_tokens, self.aux_width, self.dtype, self.on_progress = shard_tokens, aux_width, dtype, on_progress
        self.hidden = manifest["target"]["hidden_size"]
        self.buffer: _ShardBuffer | None = None
        self.skipped = {"too_short": 0, "no_loss_tokens": 0}
        self.truncated = 0

    @property
    def buffered_tokens(self) -> int:
        return self.buffer.tokens if self.buffer is not None else 0

    def add_batch(self, batch: _PendingBatch, model: Any, layer_ids: tuple[int, ...]) -> None:
        if self.buffered_tokens and self.buffered_tokens + batch.tokens > self.shard_tokens:
            self.commit(batch.start, batch.digest_before)
        for reason, n in batch.skipped.items():
            self.skipped[reason] += n
        self.truncated += batch.truncated
        if not batch.samples:
            return
        if self.buffer is None:
            capacity = max(self.shard_tokens, batch.tokens)
            self.buffer = _ShardBuffer(capacity, self.hidden, self.aux_width, self.dtype)
        states = self._run(batch.samples, model, layer_ids)
        names = self.manifest["task_names"]
        for row, sample in enumerate(batch.samples):
            if sample.task not in names:
                names.append(sample.task)
            aux, final = states[row]
            self.buffer.add(
                torch.tensor(sample.input_ids, dtype=torch.int32),
                torch.tensor(sample.loss_mask, dtype=torch.bool),
                names.index(sample.task),
                aux,
                final,
            )

    def _run(self, samples: list[Sample], model: Any, layer_ids: tuple[int, ...]) -> list[tuple[Any, torch.Tensor]]:
        """(aux, final) per sample, 16-bit on the CPU, from forward passes of at most max_batch_tokens padded tokens.

        Sequences are grouped by length so that activation memory depends on that budget, not on how
        long the longest sequence of a batch happens to be. Grouping depends only on the batch itself.
        """
        device = next(model.parameters()).device
        out: list[tuple[Any, torch.Tensor]] = [None] * len(samples)  # type: ignore[list-item]
        for group in _length_groups([len(s.input_ids) for s in samples], self.max_batch_tokens):
            width = max(len(samples[i].input_ids) for i in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)  # right padding: causal attention ignores it
            for row, index in enumerate(group):
                ids[row, : len(samples[index].input_ids)] = torch.tensor(samples[index].input_ids, dtype=torch.long)
            states = capture(model, ids.to(device), layer_ids, all_logits=False)
            aux = states.aux.to(self.dtype).cpu() if self.aux_width else None  # one transfer per forward pass
            final = states.final.to(self.dtype).cpu()
            del states
            for row, index in enumerate(group):
                length = len(samples[index].input_ids)
                out[index] = (aux[row, :length] if aux is not None else None, final[row, :length])
        return out


    def commit(self, consumed: int, digest: str) -> None:
        """Write the buffer as the next shard (if it holds anything), then the manifest that records it."""
        manifest = self.manifest
        if self.buffered_tokens:
            from safetensors.torch import save_file

            tensors = self.buffer.tensors()
            name = shard_name(len(manifest["shards"]))
            _atomic_write(self.out_dir / name, lambda tmp: save_file(
                tensors, str(tmp), metadata={"format": FORMAT, "format_version": str(FORMAT_VERSION)}))
            ids = tensors["input_ids"].to(torch.int64)
            mask = tensors["loss_mask"]
            self.counts += torch.bincount(ids[mask], minlength=self.counts.shape[0])
            lengths = self.buffer.lengths
            position = 0
            for task_id, length in zip(self.buffer.tasks, lengths):
                entry = manifest["tasks"].setdefault(manifest["task_names"][task_id],
                                                     {"sequences": 0, "tokens": 0, "loss_tokens": 0})
                entry["sequences"] += 1
                entry["tokens"] += length
                entry["loss_tokens"] += int(mask[position : position + length].sum())
                position += length
            manifest["shards"].append({"file": name, "sequences": len(lengths), "tokens": int(ids.shape[0]),
                                       "samples_end": consumed})
            manifest["num_sequences"] += len(lengths)
            manifest["total_tokens"] += int(ids.shape[0])
            manifest["loss_tokens"] += int(mask.sum())
            del tensors, ids, mask
        self.buffer = None
        for reason, n in self.skipped.items():
            manifest["skipped_samples"][reason] += n
        manifest["truncated_samples"] += self.truncated
        self.skipped = {"too_short": 0, "no_loss_tokens": 0}
        self.truncated = 0
        manifest["samples_consumed"] = consumed
        manifest["samples_digest"] = digest
        _write_token_counts(self.out_dir / TOKEN_COUNTS_FILE, self.counts)
        _write_json(self.out_dir / MANIFEST_FILE, manifest)
        if self.on_progress is not None:
            self.on_progress(consumed, manifest)


def _length_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped shortest first, each group's rows x longest length within max_tokens (or one row)."""
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if groups and (len(groups[-1]) + 1) * lengths[index] <= max_tokens:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


# --- reading --------------------------------------------------------------------------------------
class ShardDataset:
    """A built shard directory, read lazily: shards are memory-mapped and sliced, never loaded whole.

    Sequence ids are 0..num_sequences-1 in build order. Windows are rows (sequence, start, length).
    """

    def __init__(self, path: str | Path, open_handles: int = 4):
        from safetensors import safe_open

        self.path = Path(path)
        manifest_path = self.path / MANIFEST_FILE
        if not manifest_path.exists():
            raise DraftsyncError(f"{self.path} has no {MANIFEST_FILE}", "point at a directory written by build_shards")
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("format") != FORMAT or self.manifest.get("format_version") != FORMAT_VERSION:
            raise DraftsyncError(
                f"{self.path} holds format {self.manifest.get('format')!r} v{self.manifest.get('format_version')}",
                f"rebuild it with this version of draftsync ({FORMAT} v{FORMAT_VERSION})")
        if not self.manifest.get("complete"):
            raise DraftsyncError(f"the dataset in {self.path} is incomplete ({len(self.manifest['shards'])} shards)",
                                 "rerun build_shards with the same inputs to finish it")
        self._open_handles = max(1, open_handles)
        self._handles: OrderedDict[int, Any] = OrderedDict()
        shard_of, starts, lengths, tasks = [], [], [], []
        for index, shard in enumerate(self.manifest["shards"]):
            with safe_open(str(self.path / shard["file"]), framework="pt") as handle:
                offsets = handle.get_tensor("offsets")
                tasks.append(handle.get_tensor("task_index").to(torch.int64))
            shard_of.append(torch.full((offsets.shape[0] - 1,), index, dtype=torch.int64))
            starts.append(offsets[:-1])
            lengths.append(offsets[1:] - offsets[:-1])
        empty = torch.zeros(0, dtype=torch.int64)
        self._shard_of = torch.cat(shard_of) if shard_of else empty
        self._start = torch.cat(starts) if starts else empty
        self._length = torch.cat(lengths) if lengths else empty
        self._task = torch.cat(tasks) if tasks else empty
        self._perm_cache: tuple[tuple[int, int, int], torch.Tensor] | None = None

    # facts
    @property
    def num_sequences(self) -> int:
        return int(self._length.shape[0])

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.manifest["aux_layer_ids"])

    @property
    def has_aux(self) -> bool:
        return bool(self.manifest["store_aux"])

    @property
    def task_names(self) -> list[str]:
        return list(self.manifest["task_names"])

    def sequence_lengths(self) -> torch.Tensor:
        return self._length.clone()

    def sequence_tasks(self) -> list[str]:
        names = self.manifest["task_names"]
        return [names[i] for i in self._task.tolist()]

    def token_counts(self) -> torch.Tensor:
        """How often each target id is a loss-masked token: LongTensor[V], for choosing the draft vocabulary."""
        from safetensors import safe_open

        with safe_open(str(self.path / self.manifest["token_counts_file"]), framework="pt") as handle:
            return handle.get_tensor("token_counts").to(torch.int64)

    # selection
    def split(self, holdout_fraction: float, seed: int) -> tuple[list[int], list[int]]:
        """(train, holdout) sequence ids, sorted; at least one of each when there are two or more sequences."""
        n = self.num_sequences
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        held = round(holdout_fraction * n) if n > 1 else 0
        held = min(max(held, 1 if n > 1 and holdout_fraction > 0 else 0), max(n - 1, 0))
        return sorted(order[held:]), sorted(order[:held])

    def windows(self, sequence_ids: Sequence[int] | torch.Tensor, seq_len: int) -> torch.Tensor:
        """Cut sequences into consecutive windows of up to `seq_len` tokens, dropping those under 3 tokens.

        Returns LongTensor [W, 3] of (sequence id, start, length), in sequence order.
        """
        if seq_len < MIN_WINDOW_TOKENS:
            raise DraftsyncError(f"seq_len={seq_len} is too short", f"use seq_len >= {MIN_WINDOW_TOKENS}")
        ids = torch.as_tensor(list(sequence_ids) if not isinstance(sequence_ids, torch.Tensor) else sequence_ids,
                              dtype=torch.int64)
        if ids.numel() == 0:
            return torch.zeros(0, 3, dtype=torch.int64)
        lengths = self._length[ids]
        per_sequence = (lengths + seq_len - 1) // seq_len
        sequence = torch.repeat_interleave(ids, per_sequence)
        first_of = torch.repeat_interleave(torch.cumsum(per_sequence, 0) - per_sequence, per_sequence)
        start = (torch.arange(sequence.shape[0]) - first_of) * seq_len
        length = torch.clamp(torch.repeat_interleave(lengths, per_sequence) - start, max=seq_len)
        keep = length >= MIN_WINDOW_TOKENS
        return torch.stack([sequence[keep], start[keep], length[keep]], dim=1)

    # reading
    def _handle(self, shard: int) -> Any:
        from safetensors import safe_open

        handle = self._handles.pop(shard, None)
        if handle is None:
            handle = safe_open(str(self.path / self.manifest["shards"][shard]["file"]), framework="pt")
        self._handles[shard] = handle
        while len(self._handles) > self._open_handles:
            self._handles.popitem(last=False)
        return handle

    def _read(self, sequence: int, start: int, length: int, names: Sequence[str]) -> dict[str, torch.Tensor]:
        shard = int(self._shard_of[sequence])
        begin = int(self._start[sequence]) + start
        handle = self._handle(shard)
        return {name: handle.get_slice(name)[begin : begin + length] for name in names}

    def batch(self, windows: torch.Tensor, seq_len: int | None = None) -> TrainingBatch:
        """The windows' tokens and states, right-padded to `seq_len` (default: the longest window).

        States come back in float32; `target_logits` is None (the trainer computes lm_head(final)).
        """
        windows = torch.as_tensor(windows, dtype=torch.int64).reshape(-1, 3)
        if windows.shape[0] == 0:
            raise DraftsyncError("a batch of zero windows was asked for", "select at least one window")
        width = int(seq_len) if seq_len is not None else int(windows[:, 2].max())
        if int(windows[:, 2].max()) > width:
            raise DraftsyncError(f"a window is longer than seq_len={width}", "cut windows with the same seq_len")
        hidden = self.manifest["target"]["hidden_size"]
        count = windows.shape[0]
        ids = torch.zeros(count, width, dtype=torch.long)
        valid = torch.zeros(count, width, dtype=torch.bool)
        loss_mask = torch.zeros(count, width, dtype=torch.bool)
        final = torch.zeros(count, width, hidden, dtype=torch.float32)
        aux_width = len(self.manifest["aux_layer_ids"]) * hidden
        aux = torch.zeros(count, width, aux_width, dtype=torch.float32) if self.has_aux else None
        names = ("input_ids", "loss_mask", "final", "aux") if self.has_aux else ("input_ids", "loss_mask", "final")
        for row, (sequence, start, length) in enumerate(windows.tolist()):
            part = self._read(sequence, start, length, names)
            ids[row, :length] = part["input_ids"].to(torch.long)
            valid[row, :length] = True
            loss_mask[row, :length] = part["loss_mask"].to(torch.bool)
            final[row, :length] = part["final"].to(torch.float32)
            if aux is not None:
                aux[row, :length] = part["aux"].to(torch.float32)
        return TrainingBatch(ids=ids, valid=valid, loss_mask=loss_mask & valid, aux=aux, final=final,
                             target_logits=None)

    def _epoch_order(self, seed: int, epoch: int, count: int) -> torch.Tensor:
        key = (seed, epoch, count)
        if self._perm_cache is None or self._perm_cache[0] != key:
            mixed = int.from_bytes(hashlib.sha256(f"{seed}/{epoch}".encode()).digest()[:7], "big")
            self._perm_cache = (key, torch.randperm(count, generator=torch.Generator().manual_seed(mixed)))
        return self._perm_cache[1]

    def batch_for_step(self, step: int, batch_size: int, seq_len: int, seed: int, windows: torch.Tensor) -> TrainingBatch:
        """Step `step`'s batch: a pure function of its arguments, so training can resume mid-epoch.

        Each epoch is a permutation of `windows` drawn from (seed, epoch); an epoch has
        max(1, W // batch_size) steps and the remainder of the permutation is left out that epoch.
        """
        rows = self.windows_for_step(step, batch_size, seed, windows)
        return self.batch(windows[rows], seq_len)

    def windows_for_step(self, step: int, batch_size: int, seed: int, windows: torch.Tensor) -> torch.Tensor:
        """Row indices into `windows` that step `step` trains on (see batch_for_step)."""
        count = int(windows.shape[0])
        if count == 0:
            raise DraftsyncError("there are no training windows", "give longer sequences or a smaller seq_len")
        per_epoch = max(1, count // batch_size)
        epoch, index = divmod(int(step), per_epoch)
        return self._epoch_order(seed, epoch, count)[index * batch_size : (index + 1) * batch_size]

    def batches(self, windows: torch.Tensor, batch_size: int, seq_len: int | None = None) -> Iterator[TrainingBatch]:
        """All windows in order, `batch_size` at a time: for evaluation on held-out sequences."""
        for begin in range(0, int(windows.shape[0]), batch_size):
            yield self.batch(windows[begin : begin + batch_size], seq_len)

    # checks
    def summary_rows(self, chunk_tokens: int = 8192) -> list[dict]:
        """One row per sequence for the data checks, read shard by shard in chunks of ~chunk_tokens."""
        from safetensors import safe_open

        names = self.manifest["task_names"]
        rows: list[dict] = []
        for shard in self.manifest["shards"]:
            with safe_open(str(self.path / shard["file"]), framework="pt") as handle:
                keys = set(handle.keys())
                offsets = handle.get_tensor("offsets")
                tasks = handle.get_tensor("task_index").tolist()
                aux_width = handle.get_slice("aux").get_shape()[1] if "aux" in keys else 0
                final_width = handle.get_slice("final").get_shape()[1]
                count = offsets.shape[0] - 1
                first = 0
                while first < count:
                    last = first + 1
                    while last < count and int(offsets[last + 1] - offsets[first]) <= chunk_tokens:
                        last += 1
                    begin, end = int(offsets[first]), int(offsets[last])
                    ids = handle.get_slice("input_ids")[begin:end].to(torch.int64)
                    mask = handle.get_slice("loss_mask")[begin:end].to(torch.int64)
                    bad = (~torch.isfinite(handle.get_slice("final")[begin:end].float())).sum(-1)
                    if aux_width:
                        bad = bad + (~torch.isfinite(handle.get_slice("aux")[begin:end].float())).sum(-1)
                    for i in range(first, last):
                        a, b = int(offsets[i]) - begin, int(offsets[i + 1]) - begin
                        rows.append({
                            "task": names[tasks[i]] if 0 <= tasks[i] < len(names) else f"<task {tasks[i]}>",
                            "length": b - a,
                            "loss_tokens": int(mask[a:b].sum()),
                            "max_token_id": int(ids[a:b].max()) if b > a else -1,
                            "nonfinite": int(bad[a:b].sum()),
                            "aux_width": int(aux_width),
                            "final_width": int(final_width),
                        })
                    first = last
        return rows
