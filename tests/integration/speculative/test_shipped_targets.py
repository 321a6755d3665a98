"""The shipped built-in targets: each is its recipe's build, a fresh clone copies it instead of training it, and a
copy whose files are not the recorded ones is refused. The builder itself runs here on a short recipe."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from draftsync.errors import DraftsyncError
from draftsync.speculative.builtin import shipped_targets
from draftsync.speculative.builtin.shipped_targets import (
    MANIFEST,
    SHIPPED,
    SHIPPED_DIR,
    find_shipped,
    read_manifest,
    ship,
    shipped_name,
    verify,
)
from draftsync.speculative.builtin.targets import build_target, builtin_recipe
from draftsync.speculative.targets import TARGET_INFO_FILE, load_target


@pytest.mark.parametrize("size,family,version", SHIPPED, ids=[shipped_name(*s) for s in SHIPPED])
def test_every_shipped_target_is_the_build_of_its_recipe_as_it_is_now(size, family, version):
    folder = SHIPPED_DIR / shipped_name(size, family, version)
    recipe = builtin_recipe(version, size, family)
    manifest = verify(folder)
    assert manifest["recipe_key"] == recipe.key(), (
        f"the recipe of shipped target {folder.name} changed since it was built: rebuild it with "
        "`draftsync demo --rebuild-targets` and commit draftsync/speculative/builtin/shipped/"
    )
    info = json.loads((folder / TARGET_INFO_FILE).read_text())
    assert info["recipe_key"] == recipe.key() and info["train_steps"] == recipe.steps


def test_a_fresh_cache_gets_the_shipped_files_byte_for_byte(tmp_path):
    recipe = builtin_recipe(2, "test")
    built = build_target(recipe, tmp_path)  # v2 alone: its parent is not needed when it ships
    folder = SHIPPED_DIR / shipped_name("test", "llama", 2)
    assert sorted(p.name for p in built.iterdir()) == sorted(read_manifest(folder)["files"])
    for name in read_manifest(folder)["files"]:
        assert (built / name).read_bytes() == (folder / name).read_bytes(), name
    assert not (tmp_path / f"target-{builtin_recipe(1, 'test').key()}").exists()
    model, _ = load_target(built)
    assert model.config.num_hidden_layers == recipe.num_layers


@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """The shipped targets copied to a folder of their own, which build_target then reads instead."""
    root = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, root)
    monkeypatch.setattr(shipped_targets, "SHIPPED_DIR", root)
    return root


def test_a_shipped_weight_file_that_fails_its_hash_is_refused_naming_it_and_nothing_is_cached(shipped_copy, tmp_path):
    weights = shipped_copy / shipped_name("test", "llama", 1) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    recipe = builtin_recipe(1, "test")
    with pytest.raises(DraftsyncError) as caught:
        build_target(recipe, tmp_path / "cache")
    assert str(weights) in caught.value.what
    assert "draftsync demo --rebuild-targets" in caught.value.fix
    assert not (tmp_path / "cache" / f"target-{recipe.key()}").exists()


def test_a_shipped_folder_with_a_file_missing_or_added_is_refused(shipped_copy):
    folder = shipped_copy / shipped_name("test", "llama", 1)
    (folder / "config.json").unlink()
    with pytest.raises(DraftsyncError, match="manifest records"):
        find_shipped(builtin_recipe(1, "test").key())
    other = shipped_copy / shipped_name("test", "llama", 2)
    (other / "extra.bin").write_bytes(b"x")
    with pytest.raises(DraftsyncError, match=str(other)):
        verify(other)


def test_the_builder_trains_a_short_recipe_and_ships_what_it_built(tmp_path):
    v1 = dataclasses.replace(builtin_recipe(1, "test"), steps=3)
    v2 = dataclasses.replace(builtin_recipe(2, "test"), steps=2, parent=v1)
    assert find_shipped(v2.key()) is None
    built = build_target(v2, tmp_path / "cache")
    info = json.loads((built / TARGET_INFO_FILE).read_text())
    assert info["train_steps"] == 2 and info["parent_recipe_key"] == v1.key()
    assert json.loads((tmp_path / "cache" / f"target-{v1.key()}" / TARGET_INFO_FILE).read_text())["train_steps"] == 3
    load_target(built)

    folder = ship(built, "short-v2", v2.key(), root=tmp_path / "shipped")
    assert set(read_manifest(folder)["files"]) == {p.name for p in built.iterdir()}
    assert MANIFEST not in read_manifest(folder)["files"]
    assert find_shipped(v2.key(), root=tmp_path / "shipped") == folder
