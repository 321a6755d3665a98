"""How a registered version stores its checkpoint, and the plain checkpoint directory every later step reads.

MLflow users register a target in one of three layouts:
- a plain Hugging Face checkpoint directory (config.json, safetensors, tokenizer), what `draftsync targets register`
  logs by default and what draftsync logs for every drafter;
- the transformers flavor (`mlflow.transformers.log_model`): an MLmodel file, the weights under `model/`, the
  tokenizer under `components/tokenizer/`;
- the transformers flavor by reference (`save_pretrained=False`): the MLmodel names a hub repository and revision,
  and no weights are stored; the worker must already hold that revision.

The dataset, training, validation and vLLM all read one plain directory. `materialize` builds it inside a fresh
download, from links to the files (nothing is copied), and records the layout beside it; `read_layout` reads it back.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    from draftsync.settings import Settings

PLAIN = "checkpoint"
FLAVOR = "transformers"
BY_REFERENCE = "transformers-by-reference"

LAYOUT_FILE = "draftsync-layout.json"  # beside the downloaded files; names the layout and the directory to read
CHECKPOINT_VIEW = "draftsync-checkpoint"  # the plain directory built from links, for the flavor layouts
MLMODEL_FILE = "MLmodel"
LOCAL_DIR_METADATA = Path(".cache") / "huggingface" / "download" / "config.json.metadata"

_REVISION = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


@dataclass(frozen=True)
class TargetLayout:
    """A downloaded version: its layout, the plain checkpoint directory to read, and what the layout told."""

    layout: str
    path: Path
    model_id: str | None = None  # the MLflow logged model (MLflow 3: a version's source `models:/m-...`)
    source_model: str | None = None  # by reference: the hub repository ...
    source_revision: str | None = None  # ... and its commit
    torch_dtype: str | None = None  # the transformers flavor's MLmodel fields
    task: str | None = None
    transformers_version: str | None = None

    def to_json(self, root: Path) -> str:
        fields: dict[str, Any] = asdict(self)
        fields["path"] = os.path.relpath(self.path, root) if self.path.is_relative_to(root) else str(self.path)
        return json.dumps(fields, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, root: Path) -> TargetLayout:
        fields = json.loads(text)
        return cls(**{**fields, "path": root / fields["path"]})


def check_flavor(flavor: str, named: str = "target flavor") -> None:
    """The ways draftsync logs a target: PLAIN (the checkpoint's files) or FLAVOR (an MLflow transformers model)."""
    if flavor not in (PLAIN, FLAVOR):
        raise DraftsyncError(f"{named} {flavor!r} is not known", f"use {PLAIN} or {FLAVOR}")


def read_layout(downloaded: Path) -> TargetLayout:
    """The layout `materialize` recorded in `downloaded`; a plain directory downloaded before it did, as plain."""
    downloaded = Path(downloaded)
    record = downloaded / LAYOUT_FILE
    if record.is_file():
        return TargetLayout.from_json(record.read_text(), downloaded)
    return TargetLayout(PLAIN, downloaded)


def is_materialized(downloaded: Path) -> bool:
    return (Path(downloaded) / LAYOUT_FILE).is_file() or (Path(downloaded) / "config.json").is_file()


def materialize(downloaded: Path, what: str) -> TargetLayout:
    """Find the layout of the files in `downloaded`; for a flavor layout, build its plain directory and record both
    there (a plain checkpoint is left as it is).

    `what` names the version in errors ("target hf-chat v1"). Raises DraftsyncError, naming the layout found, what
    is missing and the fix, for anything draftsync cannot read; the caller then publishes nothing."""
    downloaded = Path(downloaded)
    if (downloaded / "config.json").is_file():
        return TargetLayout(PLAIN, downloaded)
    if not (downloaded / MLMODEL_FILE).is_file():
        found = ", ".join(sorted(p.name for p in downloaded.iterdir())[:12]) or "nothing"
        raise DraftsyncError(
            f"{what}: its files hold neither a Hugging Face checkpoint (config.json) nor an MLflow model (MLmodel); "
            f"found: {found}",
            "register the checkpoint directory with `draftsync targets register`, or log it with "
            "mlflow.transformers.log_model",
        )
    layout = _flavor_layout(downloaded, what)
    (downloaded / LAYOUT_FILE).write_text(layout.to_json(downloaded))
    return layout


def _flavor_layout(downloaded: Path, what: str) -> TargetLayout:
    import yaml

    try:
        mlmodel = yaml.safe_load((downloaded / MLMODEL_FILE).read_text()) or {}
    except yaml.YAMLError as error:
        raise DraftsyncError(
            f"{what}: its MLmodel file is not YAML ({error})", "log the model again with mlflow.transformers.log_model"
        ) from error
    flavors = mlmodel.get("flavors") or {}
    if FLAVOR not in flavors:
        raise DraftsyncError(
            f"{what} is an MLflow model of flavor {', '.join(sorted(flavors)) or 'none'}, not a transformers "
            "checkpoint: draftsync trains drafters for Hugging Face causal language models",
            "register the target with mlflow.transformers.log_model or `draftsync targets register`",
        )
    conf = flavors[FLAVOR]
    facts = {
        "model_id": _text(mlmodel.get("model_id")),
        "torch_dtype": _text(conf.get("torch_dtype")),
        "task": _text(conf.get("task")),
        "transformers_version": _text(conf.get("transformers_version")),
    }
    if conf.get("peft_adaptor"):
        raise DraftsyncError(
            f"{what} is a PEFT adapter logged with the transformers flavor; a drafter needs the whole target",
            "merge the adapter into its base model (merge_and_unload), then log the merged model",
        )
    tokenizer = downloaded / "components" / "tokenizer"
    sources = [tokenizer] if tokenizer.is_dir() else []
    if conf.get("model_binary"):
        weights = downloaded / str(conf["model_binary"])
        if not (weights / "config.json").is_file():
            raise DraftsyncError(
                f"{what} is a transformers-flavor model whose weights folder {weights.name}/ has no config.json",
                "log the model again with mlflow.transformers.log_model (save_pretrained=True)",
            )
        view = _link_view(downloaded, [weights, *sources])
        return TargetLayout(FLAVOR, view, **facts)
    repo_id, revision = conf.get("source_model_name"), conf.get("source_model_revision")
    if not repo_id or not revision:
        raise DraftsyncError(
            f"{what} is a transformers-flavor model with neither weights (model/) nor a source_model_name and "
            "source_model_revision to find them by",
            "log the model again with mlflow.transformers.log_model, with its weights or by reference to a hub "
            "repository",
        )
    local = find_local_copy(str(repo_id), str(revision), what)
    view = _link_view(downloaded, [local, *sources])
    return TargetLayout(BY_REFERENCE, view, source_model=str(repo_id), source_revision=str(revision), **facts)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _link_view(downloaded: Path, sources: list[Path]) -> Path:
    """A plain checkpoint directory of links to the files of `sources`; a later source's file wins a name."""
    view = downloaded / CHECKPOINT_VIEW
    view.mkdir()
    for source in sources:
        for file in sorted(source.iterdir()):
            if not file.is_file():
                continue
            link = view / file.name
            link.unlink(missing_ok=True)
            target = os.path.realpath(file)
            # inside the download: a relative link, which survives the download's rename into place
            inside = Path(target).is_relative_to(os.path.realpath(downloaded))
            link.symlink_to(os.path.relpath(target, os.path.realpath(view)) if inside else target)
    return view


# -- a by-reference target's weights on this worker --------------------------------------------------------
def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as huggingface_hub finds it, read now (a test or a worker may set it late)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"


def model_places(settings: Settings) -> list[tuple[str, Path]]:
    """Where a worker keeps checkpoints, each with the setting that names it: the hub cache, then the mirrors,
    then the model roots."""
    places = [("the Hugging Face cache (HF_HOME, HF_HUB_CACHE)", hub_cache_dir())]
    places += [("DRAFTSYNC_MODEL_MIRRORS", path) for path in settings.model_mirror_paths]
    places += [("DRAFTSYNC_MODEL_ROOTS", path) for path in settings.model_root_paths]
    return places


def find_local_copy(repo_id: str, revision: str, what: str) -> Path:
    """The directory holding `repo_id` at `revision` on this worker, in the hub cache's layout
    (`models--org--name/snapshots/<commit>`) or a local-dir download's (`org/name`, its revision recorded by
    `hf download --local-dir`), in any of `model_places`. Downloads it only when DRAFTSYNC_HUB_DOWNLOADS is on."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise DraftsyncError(
            f"{what} refers to {repo_id!r}, which is not a hub repository id ({error})",
            "log the model again by reference to an 'org/name' repository",
        ) from error
    if not _REVISION.match(revision):
        raise DraftsyncError(
            f"{what} refers to {repo_id} at revision {revision!r}, which is not a commit or branch name",
            "log the model again; MLflow records the repository's commit",
        )
    from draftsync.settings import Settings

    settings = Settings()
    places = model_places(settings)
    other_revisions: list[str] = []
    for _, place in places:
        for look_in in (_in_hub_cache, _in_local_dir):
            found, others = look_in(place, repo_id, revision)
            if found is not None:
                return found
            other_revisions += others
    if settings.hub_downloads:
        return _download(repo_id, revision, what)
    looked = "; ".join(f"{path} ({setting})" for setting, path in places)
    if other_revisions:
        raise DraftsyncError(
            f"{what} is logged by reference to {repo_id} at revision {revision} (its MLmodel), but this worker "
            f"holds {repo_id} only at {', '.join(other_revisions)} (looked in: {looked})",
            f"fetch revision {revision} of {repo_id} (`hf download {repo_id} --revision {revision}`), or log the "
            "target again against the revision the worker holds",
        )
    raise DraftsyncError(
        f"{what} is logged by reference to {repo_id} at revision {revision}, and no copy of it is on this worker "
        f"(looked in: {looked})",
        f"put it in the Hugging Face cache (`hf download {repo_id} --revision {revision}`) or under a directory "
        f"named in DRAFTSYNC_MODEL_MIRRORS (as <dir>/{repo_id}, with `--local-dir`), or set "
        "DRAFTSYNC_HUB_DOWNLOADS=true to let the worker download it",
    )


def _in_hub_cache(place: Path, repo_id: str, revision: str) -> tuple[Path | None, list[str]]:
    repo = place / ("models--" + repo_id.replace("/", "--"))
    if not repo.is_dir():
        return None, []
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit
    if (snapshot / "config.json").is_file():
        return snapshot, []
    snapshots = repo / "snapshots"
    held = sorted(p.name for p in snapshots.iterdir() if (p / "config.json").is_file()) if snapshots.is_dir() else []
    return None, [f"{name} ({snapshots / name})" for name in held]


def _in_local_dir(place: Path, repo_id: str, revision: str) -> tuple[Path | None, list[str]]:
    folder = place / repo_id
    if not (folder / "config.json").is_file():
        return None, []
    metadata = folder / LOCAL_DIR_METADATA
    recorded = metadata.read_text().splitlines()[0].strip() if metadata.is_file() else ""
    if recorded == revision:
        return folder, []
    return None, [f"{recorded or 'an unrecorded revision'} ({folder})"]


def _download(repo_id: str, revision: str, what: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=repo_id, revision=revision))
    except Exception as error:  # huggingface_hub raises many types: offline, auth, missing revision
        raise DraftsyncError(
            f"{what}: downloading {repo_id} at revision {revision} from the hub failed ({type(error).__name__}: "
            f"{error})",
            "check the worker's network and HF_TOKEN, or place the checkpoint on the worker (HF_HOME or "
            "DRAFTSYNC_MODEL_MIRRORS)",
        ) from error
