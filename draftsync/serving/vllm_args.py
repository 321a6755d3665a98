"""The `vllm serve` command line a GPU worker runs for a target and its drafter.

The long form is used: `vllm serve <target dir> --speculative-config '<json>'`, with the target as the
positional model. vLLM's parser (vllm/utils/argparse_utils.py, `FlexibleArgumentParser.parse_args`) still
accepts `--model <dir>` after `serve`, but only by moving it to the positional slot, with a warning that the
option will be removed; the positional form is the one it documents (`vllm serve [model_tag] [options]`).
vLLM's short form (serving the drafter directory alone) only works when the drafter's verifier is a hub id,
and our targets are local checkpoint directories.

The result is an argument list, never a shell string.

`--trust-remote-code` lets vLLM import and run Python shipped inside a checkpoint. It is written only when
DRAFTSYNC_TRUST_REMOTE_CODE is set (the same switch `load_target` obeys), and never comes in through
`extra_vllm_args`, so one setting decides for every launch. The paths are rendered as given: callers that launch
(`ServingDeployment.vllm_launch`, `VllmBackend`) confine them to the model roots first (model_paths.py).

`num_speculative_tokens_per_batch_size` (vLLM's dynamic speculative decoding) is a list of
`[first batch size, last batch size, k]` with both ends inclusive (vllm/v1/spec_decode/dynamic/utils.py,
`validate_and_normalize_dynamic_sd_schedule`): ranges positive, sorted, not overlapping, the first starting
at 1; a gap takes the previous range's k, sizes past the last range keep its k; k >= 0, 0 being no drafts at
that batch size. vLLM caps each k at `num_speculative_tokens` without a word, so a k above gamma is refused
here rather than quietly lowered.

Medusa (vllm/config/speculative.py, vllm/v1/spec_decode/medusa.py): `num_speculative_tokens` replaces the
drafter's `num_heads`, so a gamma above the heads it was trained with asks for heads the checkpoint has no
weights for (vLLM then fails to start: "weights were not initialized from checkpoint"); and its proposer
drafts exactly `num_speculative_tokens` every step, so a per-batch-size schedule cannot apply. Both are
refused here, the heads read from the drafter's config.json when it is at hand. So are heads over part of
the vocabulary (`truncated_vocab_size` below `vocab_size`, as draftsync saved Medusa drafters before
methods/medusa/checkpoint.py wrote vLLM's layout): vLLM's loader expects every head's lm_head to span it.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from draftsync.errors import DraftsyncError
from draftsync.profiles import DraftSampling
from draftsync.speculative.families import draft_layers_split, target_family, vllm_attention_kinds
from draftsync.speculative.methods import DFLASH, MEDUSA, METHODS, NGRAM, VLLM_METHODS, needs_no_checkpoint
from draftsync.speculative.placement import visible_devices

# vLLM's default n-gram window when neither end is given (SpeculativeConfig.__post_init__).
DEFAULT_PROMPT_LOOKUP = 5

# Flags draftsync sets itself; an extra argument may not set them again (argparse keeps the last one, and
# vLLM merges `--speculative-config.<key>` arguments into a second `--speculative-config`).
RESERVED_VLLM_FLAGS = (
    "--model",
    "--speculative-config",
    "--port",
    "--host",
    "--served-model-name",
    "--tensor-parallel-size",
)
_RESERVED_SHORT_FLAGS = ("-tp",)  # vLLM's short form of --tensor-parallel-size
TRUST_REMOTE_CODE_FLAG = "--trust-remote-code"
# Per-request draft and accepted counts on each completion (`metrics.speculative_decoding`, vLLM >= 0.32): the
# per-request acceptance a P5/P50 gate needs. vLLM refuses it when speculation is off, so it comes with a drafter.
PER_REQUEST_METRICS_FLAG = "--per-request-spec-decode-metrics"
# Which modelling code serves the target: a family's (`Family.vllm_model_impl`) unless the deployment's arguments say.
MODEL_IMPL_FLAG = "--model-impl"


@dataclass(frozen=True)
class VllmLaunch:
    """An argument list (never a shell string) and the speculative config it carries, for the record."""

    argv: list[str]
    speculative_config: dict | None

    def as_record(self) -> dict:
        return {"argv": self.argv, "speculative_config": self.speculative_config}


def _long_flag(text: str) -> str | None:
    """The flag an argument sets as vLLM reads it (`--a_b=x` and `--a-b.key` both set `--a-b`); None if not one."""
    if not text.startswith("--"):
        return None
    flag = text.split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    return flag if len(flag) > 2 else None


def trust_remote_code_setting(requested: bool | None = None) -> bool:
    """Whether vLLM may run code shipped in a checkpoint: never unless DRAFTSYNC_TRUST_REMOTE_CODE allows it.

    `requested` None follows the setting; False is always allowed; True without the setting is refused."""
    from draftsync.settings import Settings

    allowed = Settings().trust_remote_code
    if requested is None:
        return allowed
    if requested and not allowed:
        raise DraftsyncError(
            "trust_remote_code was asked for, but DRAFTSYNC_TRUST_REMOTE_CODE is not set: vLLM would run Python "
            "code shipped inside the checkpoint",
            "review the model's code, then set DRAFTSYNC_TRUST_REMOTE_CODE=true (draftsync then trusts it for every "
            "launch); otherwise serve a checkpoint that needs no remote code",
        )
    return bool(requested)


def reserved_flag_collisions(args: Sequence[str]) -> list[str]:
    """The arguments in `args` that would set one of the flags draftsync sets itself.

    vLLM reads `--a_b` as `--a-b`, `--flag=value` as `--flag value`, `--speculative-config.key value` as part
    of the speculative config, and argparse takes an unambiguous prefix (`--served-model`) for the whole
    flag, so each of those forms counts.
    """
    collisions = []
    for arg in args:
        text = str(arg)
        flag = _long_flag(text)
        if flag is not None:
            if any(reserved.startswith(flag) for reserved in RESERVED_VLLM_FLAGS):
                collisions.append(text)
        elif text.split("=", 1)[0] in _RESERVED_SHORT_FLAGS:
            collisions.append(text)
    return collisions


def check_extra_vllm_args(args: Sequence[str]) -> list[str]:
    """`args` as a list of strings, or an error naming the ones that collide with draftsync's own flags."""
    checked = []
    for arg in args:
        if not isinstance(arg, str):
            raise DraftsyncError(
                f"extra vLLM argument {arg!r} is not a string",
                'write each argument as its own string, e.g. ["--max-model-len", "4096"]',
            )
        checked.append(arg)
    trusting = [
        arg
        for arg in checked
        if (flag := _long_flag(arg)) and TRUST_REMOTE_CODE_FLAG.startswith(flag) and flag.startswith("--tru")
    ]
    if trusting:
        raise DraftsyncError(
            f"extra vLLM arguments {trusting} would let vLLM run Python code shipped inside the checkpoint",
            "remove them: draftsync passes --trust-remote-code itself, and only when DRAFTSYNC_TRUST_REMOTE_CODE=true "
            "is set (after the model's code was reviewed)",
        )
    collisions = reserved_flag_collisions(checked)
    if collisions:
        raise DraftsyncError(
            f"extra vLLM arguments {collisions} set flags that draftsync sets itself "
            f"({', '.join(RESERVED_VLLM_FLAGS + _RESERVED_SHORT_FLAGS)})",
            "remove them: the target, drafter, host, port, served name and tensor parallel size come from the "
            "deployment and the drafter version",
        )
    return checked


def _integer(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise DraftsyncError(f"{what} is {value!r}, not an integer", "write a whole number")
    try:
        return operator.index(value)  # type: ignore[arg-type]  # anything without __index__: the TypeError below
    except TypeError:
        raise DraftsyncError(f"{what} is {value!r}, not an integer", "write a whole number") from None


def check_schedule(schedule: Sequence[Sequence[int]], gamma: int) -> list[list[int]]:
    """A batch-size schedule as vLLM reads it, sorted, or an error saying which entry is wrong and why."""
    if isinstance(schedule, (str, bytes)):
        raise DraftsyncError(
            f"speculation schedule {schedule!r} is text, not a list of entries",
            "parse it first (json.loads of the draftsync.gamma_schedule tag)",
        )
    entries = []
    for entry in schedule:
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 3:
            raise DraftsyncError(
                f"speculation schedule entry {entry!r} is not [first batch size, last batch size, k]",
                "write each entry as three integers, both batch sizes inclusive, e.g. [1, 8, 4]",
            )
        start, end, k = (_integer(value, f"speculation schedule entry {list(entry)!r}") for value in entry)
        if start < 1 or end < start:
            raise DraftsyncError(
                f"speculation schedule entry {[start, end, k]} has batch sizes {start}..{end}",
                "use 1 <= first <= last (both inclusive)",
            )
        if not 0 <= k <= gamma:
            raise DraftsyncError(
                f"speculation schedule entry {[start, end, k]} asks for k={k} with num_speculative_tokens={gamma}",
                f"use 0 <= k <= {gamma}: vLLM caps k at num_speculative_tokens without a word, and k=0 turns "
                "drafting off at those batch sizes",
            )
        entries.append([start, end, k])
    entries.sort()
    if entries and entries[0][0] != 1:
        raise DraftsyncError(
            f"speculation schedule {entries} starts at batch size {entries[0][0]}",
            "start the first range at batch size 1, as vLLM requires",
        )
    for before, after in zip(entries, entries[1:], strict=False):
        if after[0] <= before[1]:
            raise DraftsyncError(
                f"speculation schedule ranges {before} and {after} overlap", "give each batch size one range"
            )
    return entries


@dataclass(frozen=True)
class SpeculationSpec:
    """What a server speculates with, in the terms of vLLM's `SpeculativeConfig`: the drafter `method`, its checkpoint
    (`model`; None for ngram, which drafts from the prompt), `num_speculative_tokens` (gamma), a per-batch-size
    `schedule` ([(first batch size, last batch size, k)], inclusive; None or empty: gamma at every batch size),
    ngram's prompt-lookup window, and the `draft_sample_method` of a drafter with a checkpoint (None: vLLM's default;
    "greedy" drafts the argmax and accepts it with the target's probability: lossless, but at T > 0 fewer accepted
    than standard speculative sampling; "probabilistic" samples drafts and tests the probability ratio, as the
    reference engine does, at the cost of the draft probabilities' memory)."""

    method: str | None = None
    model: Path | str | None = None
    num_speculative_tokens: int = 0
    schedule: Sequence[Sequence[int]] | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    draft_sample_method: str | None = None

    @property
    def speculates(self) -> bool:
        """A drafter checkpoint, or a method that needs none (ngram): anything else serves the target alone."""
        return self.model is not None or needs_no_checkpoint(self.method)


NO_SPECULATION = SpeculationSpec()


def render_vllm_command(
    target_dir: Path | str,
    *,
    port: int,
    served_model_name: str,
    speculation: SpeculationSpec = NO_SPECULATION,
    host: str = "127.0.0.1",
    tensor_parallel_size: int = 1,
    extra_args: Sequence[str] = (),
    trust_remote_code: bool | None = None,
) -> VllmLaunch:
    """Render the launch; a `speculation` that does not speculate (NO_SPECULATION) serves the target alone, and drops
    its schedule. `--trust-remote-code` is added only when DRAFTSYNC_TRUST_REMOTE_CODE is set (`trust_remote_code`
    True without it is refused)."""
    tensor_parallel_size = _integer(tensor_parallel_size, "tensor_parallel_size")
    if tensor_parallel_size < 1:
        raise DraftsyncError(
            f"tensor_parallel_size {tensor_parallel_size} is below 1", "pass the number of GPUs per replica"
        )
    extra = check_extra_vllm_args(extra_args)
    trusted = trust_remote_code_setting(trust_remote_code)
    check_target_for_vllm(target_dir)
    check_drafter_for_vllm(target_dir, speculation)
    argv = [
        "vllm",
        "serve",
        str(target_dir),
        "--host",
        host,
        "--port",
        str(int(port)),
        "--served-model-name",
        served_model_name,
    ]
    if tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if trusted:
        argv.append(TRUST_REMOTE_CODE_FLAG)
    if not any(_long_flag(arg) == MODEL_IMPL_FLAG for arg in extra):
        argv += family_vllm_args(target_dir)
    speculative_config = None
    if speculation.speculates:
        speculative_config = _speculative_config(speculation, tensor_parallel_size)
        argv += ["--speculative-config", json.dumps(speculative_config)]
        if not any(_long_flag(arg) == PER_REQUEST_METRICS_FLAG for arg in extra):
            argv += [PER_REQUEST_METRICS_FLAG, "summary"]
    argv += extra
    return VllmLaunch(argv=argv, speculative_config=speculative_config)


DRAFT_SAMPLING = get_args(DraftSampling)  # vLLM's draft_sample_method


def _local_config(target_dir: Path | str) -> dict | None:
    """The target's config.json where the directory is here; None for a path on another machine, or an unreadable
    config (the loader names it)."""
    config_file = Path(target_dir) / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def family_vllm_args(target_dir: Path | str) -> list[str]:
    """The launch settings the target's family needs (`Family.vllm_model_impl`), read from its config.json where the
    directory is here; none for a path on another machine or a config no family claims."""
    config = _local_config(target_dir)
    if config is None:
        return []
    try:
        family = target_family(config)
    except DraftsyncError:
        return []  # registration refuses it; vLLM is left to serve it as it can
    return [MODEL_IMPL_FLAG, family.vllm_model_impl] if family.vllm_model_impl else []


def check_target_for_vllm(target_dir: Path | str) -> None:
    """Refuse, before any server starts, a target config that transformers loads and vLLM 0.32 serves wrongly or not
    at all (read from its config.json where the directory is here; a path on another machine is left to vLLM):
    - a Qwen2 config whose `head_dim` is not hidden/heads: vLLM's Qwen2 ignores `head_dim` and its weights then do
      not fit;
    - a Qwen2/Qwen3 sliding window on only some layers (`max_window_layers` below the layer count): vLLM asserts;
    - a gpt-oss config whose `layer_types` are not a window on every even layer: vLLM's gpt-oss reads no
      `layer_types` and windows exactly those."""
    config = _local_config(target_dir)
    if config is None:
        return
    if config.get("model_type") == "gpt_oss" and config.get("layer_types") is not None:
        if list(config["layer_types"]) != vllm_attention_kinds(config):
            raise DraftsyncError(
                f"target {target_dir}: its gpt-oss layer_types {config['layer_types']} are not a sliding window on "
                "every even layer, the only arrangement vLLM's gpt-oss applies (it reads no layer_types)",
                "serve it with the reference engine (launch: reference)",
            )
    model_type, layers = config.get("model_type"), config.get("num_hidden_layers")
    heads, hidden, head_dim = config.get("num_attention_heads"), config.get("hidden_size"), config.get("head_dim")
    if model_type == "qwen2" and head_dim and heads and hidden and head_dim != hidden // heads:
        raise DraftsyncError(
            f"target {target_dir}: its Qwen2 config sets head_dim {head_dim}, but vLLM's Qwen2 uses hidden_size / "
            f"num_attention_heads = {hidden // heads} and would not fit the weights",
            "serve it with the reference engine (launch: reference), or with a vLLM whose Qwen2 reads head_dim",
        )
    windowed_layers = config.get("max_window_layers")
    if (
        model_type in ("qwen2", "qwen3")
        and config.get("use_sliding_window")
        and config.get("sliding_window")
        and layers
        and windowed_layers is not None
        and 0 < windowed_layers < layers
    ):
        raise DraftsyncError(
            f"target {target_dir}: a sliding window on {windowed_layers} of its {layers} layers "
            "(use_sliding_window with max_window_layers), which vLLM's Qwen models refuse",
            "serve it with use_sliding_window false (as its published configs have it), or with the reference engine",
        )


def check_drafter_for_vllm(target_dir: Path | str, speculation: SpeculationSpec) -> None:
    """Refuse, before any server starts, a DFlash drafter whose layers vLLM 0.32 would split across KV cache groups
    next to this target (`families.draft_layers_split`)."""
    if speculation.method != DFLASH.name or speculation.model is None:
        return
    target, drafter = _local_config(target_dir), _local_config(speculation.model)
    if target is None or drafter is None:
        return
    split = draft_layers_split(target, int(drafter.get("num_hidden_layers") or 1))
    if split:
        raise DraftsyncError(
            f"drafter {speculation.model}: {split} next to target {target_dir}",
            "serve this target with an EAGLE-3 drafter (method eagle3), or a one-layer DFlash drafter",
        )


def _speculative_config(speculation: SpeculationSpec, tensor_parallel_size: int) -> dict:
    """vLLM's `--speculative-config` for `speculation`, each field checked against what vLLM accepts for its method."""
    method, drafter_dir, gamma, schedule = (
        speculation.method,
        speculation.model,
        speculation.num_speculative_tokens,
        speculation.schedule,
    )
    prompt_lookup_min, prompt_lookup_max = speculation.prompt_lookup_min, speculation.prompt_lookup_max
    if method is None or method not in VLLM_METHODS:
        raise DraftsyncError(
            f"drafter method {method!r} cannot be served by vLLM",
            f"use one of {', '.join(VLLM_METHODS)}, or serve the target alone",
        )
    descriptor = METHODS[method]
    gamma = _integer(gamma, "gamma")
    if gamma < 1:
        raise DraftsyncError(f"gamma {gamma} is below 1", "pass the number of speculative tokens (>= 1)")
    config: dict = {"method": descriptor.vllm_method}
    if descriptor.needs_checkpoint:
        config["model"] = str(drafter_dir)
    config["num_speculative_tokens"] = gamma
    if descriptor.parallel_drafting:  # an EAGLE drafter trained to fill masked slots in one pass (P-EAGLE)
        config["parallel_drafting"] = True
    if not descriptor.needs_checkpoint:
        if drafter_dir is not None:
            raise DraftsyncError(
                f"a drafter directory ({drafter_dir}) was given with method {NGRAM.name!r}, which drafts from the "
                "prompt and loads no checkpoint",
                "pass no drafter directory for ngram, or the directory's own method",
            )
        low, high = prompt_lookup_min, prompt_lookup_max
        if low is None and high is None:
            low = high = DEFAULT_PROMPT_LOOKUP
        low = _integer(high if low is None else low, "prompt_lookup_min")
        high = _integer(low if high is None else high, "prompt_lookup_max")
        if not 1 <= low <= high:
            raise DraftsyncError(
                f"n-gram lookup lengths min={low}, max={high} are not 1 <= min <= max",
                "choose prompt_lookup_min >= 1 and prompt_lookup_max >= prompt_lookup_min",
            )
        config.update(prompt_lookup_min=low, prompt_lookup_max=high)
    else:
        if prompt_lookup_min is not None or prompt_lookup_max is not None:
            raise DraftsyncError(
                f"n-gram lookup lengths were given for method {method!r}",
                f"pass prompt_lookup_min/max only with method {NGRAM.name!r}",
            )
        if tensor_parallel_size > 1:
            config["draft_tensor_parallel_size"] = tensor_parallel_size
    if descriptor.fixed_heads:
        _check_fixed_gamma(method, drafter_dir, gamma, schedule)
    if schedule:
        config["num_speculative_tokens_per_batch_size"] = check_schedule(schedule, gamma)
    sampling = speculation.draft_sample_method
    if sampling is not None:
        if sampling not in DRAFT_SAMPLING or not descriptor.needs_checkpoint:
            raise DraftsyncError(
                f"draft sampling {sampling!r} for method {method!r}",
                f"use one of {', '.join(DRAFT_SAMPLING)} with a drafter that has a checkpoint (not ngram)",
            )
        config["draft_sample_method"] = sampling
    return config


def _check_fixed_gamma(
    method: str, drafter_dir: Path | str | None, gamma: int, schedule: Sequence[Sequence[int]] | None
) -> None:
    """vLLM's rules for drafters of one gamma (Medusa's heads, a DFlash block): no schedule; when the drafter's
    config.json is at hand, gamma within its bound, and Medusa heads over the whole vocabulary."""
    if schedule:
        raise DraftsyncError(
            f"a per-batch-size speculation schedule was given for a {method} drafter ({drafter_dir})",
            f"serve {method} with one gamma (no schedule): vLLM drafts num_speculative_tokens tokens at every step "
            "with it; use an EAGLE drafter for a schedule",
        )
    config_file = Path(str(drafter_dir)) / "config.json"
    if not config_file.is_file():
        return
    from draftsync.speculative.methods.checkpoint_files import read_json

    path, config = read_json(config_file.parent)
    vocab, truncated = config.get("vocab_size"), config.get("truncated_vocab_size")
    if method == MEDUSA.name and isinstance(vocab, int) and isinstance(truncated, int) and truncated < vocab:
        raise DraftsyncError(
            f"the Medusa drafter in {path.parent} has heads over {truncated} of the {vocab} tokens "
            "(truncated_vocab_size), which vLLM cannot load: each head's lm_head must span the vocabulary",
            "re-train it with a new sync, which saves heads over the whole vocabulary",
        )
    field = METHODS[method].gamma_limit_field
    limit = config.get(field) if field else None
    if isinstance(limit, int) and gamma > limit:
        raise DraftsyncError(
            f"gamma {gamma} asks for more tokens than the {method} drafter in {path.parent} drafts ({field} {limit})",
            f"use gamma <= {limit} (vLLM fails to start, or drafts positions the drafter was never trained for), "
            "or train a drafter that drafts more",
        )


@dataclass(frozen=True)
class ServerResources:
    """The GPUs a server that a sync starts may take, as its plan gives them: which devices, how many the target is
    split over (tensor parallelism), the fraction of each it may fill, after what serving deployments hold, and the
    longest sequence the stage needs (without it vLLM sizes the KV cache for the model's whole context, which for a
    large target does not fit beside its weights)."""

    devices: tuple[int, ...] = ()  # () : whatever the process sees (a CPU engine, or one GPU worker)
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None  # None: vLLM's own default
    max_model_len: int | None = None  # None: the model's own context
    data_parallel_size: int = 1  # replicas of the target (vLLM's data parallelism), each over tensor_parallel_size

    @classmethod
    def from_plan(cls, planned: dict | None) -> ServerResources:
        """From a plan's `servers` settings (None or empty: the defaults)."""
        if not planned:
            return cls()
        length = planned.get("max_model_len")
        if length is not None:
            length = _integer(length, "the plan's servers max_model_len")
            if length < 1:
                raise DraftsyncError(
                    f"the plan's servers max_model_len is {length}", "plan again: it is the longest sequence, >= 1"
                )
        return cls(
            devices=tuple(int(d) for d in planned.get("devices", ())),
            tensor_parallel_size=int(planned.get("tensor_parallel_size", 1)),
            data_parallel_size=int(planned.get("data_parallel_size", 1)),
            gpu_memory_utilization=planned.get("gpu_memory_utilization"),
            max_model_len=length,
        )

    def extra_args(self) -> list[str]:
        args = [] if self.data_parallel_size == 1 else ["--data-parallel-size", str(self.data_parallel_size)]
        if self.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.max_model_len is not None:
            args += ["--max-model-len", str(self.max_model_len)]
        return args

    def merged_args(self, extra: Sequence[str]) -> list[str]:
        """`extra` (a deployment's arguments) with these after it, each flag these set taken out of `extra`: the
        plan sized the memory for its own values, and vLLM would otherwise read the flag twice."""
        own = self.extra_args()
        flags = {arg for arg in own if arg.startswith("--")}
        kept: list[str] = []
        skip_value = False
        for arg in map(str, extra):
            if skip_value:
                skip_value = False
                continue
            if _long_flag(arg) in flags:
                skip_value = "=" not in arg
                continue
            kept.append(arg)
        return [*kept, *own]

    def environment(self, parent: Mapping[str, str] | None = None, server: str = "a vLLM server") -> dict[str, str]:
        """The planned devices, as this worker sees them (`parent`: its environment, default ours): the server sees
        only them, numbered from 0."""
        if not self.devices:
            return {}
        return {"CUDA_VISIBLE_DEVICES": visible_devices(self.devices, os.environ if parent is None else parent, server)}
