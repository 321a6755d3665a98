"""Atomic writes: the content lands whole, a failed or killed writer leaves the old file, concurrent writers never
tear each other; a published directory appears whole or not at all, and the first of two builders wins."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from draftsync.files import atomic_write, atomic_write_all, is_temp_file, publish_directory

from tests.support.killed_writer import killed_mid_write


def test_the_content_lands_with_the_mode_of_a_file_written_in_place(tmp_path):
    path = tmp_path / "data.json"
    atomic_write(path, lambda tmp: tmp.write_text("new"))
    assert path.read_text() == "new"
    atomic_write(path, lambda tmp: tmp.write_bytes(b"newer"))
    assert path.read_bytes() == b"newer"
    in_place = tmp_path / "in-place.json"
    in_place.write_text("x")
    assert path.stat().st_mode == in_place.stat().st_mode  # not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "in-place.json"]


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt("stopped")])
def test_a_write_that_raises_leaves_the_old_file_and_no_temporary_file(tmp_path, error):
    path = tmp_path / "data.json"
    path.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise error

    with pytest.raises(type(error)):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["data.json"]


def test_a_killed_writer_leaves_the_old_file_and_a_temporary_file_that_is_recognised(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("old")
    killed_mid_write(path, "{")
    assert path.read_text() == "old"
    (stray,) = (p for p in tmp_path.iterdir() if p != path)
    assert stray.read_text() == "{"
    assert is_temp_file(stray)
    others = ("manifest.json", ".hidden", "x.tmp", ".x.tmp", "a.1.0a1b2c3d.tmp")
    assert not any(is_temp_file(tmp_path / name) for name in others)


def test_a_group_is_replaced_in_order_only_when_every_file_was_written(tmp_path):
    weights, config = tmp_path / "weights.bin", tmp_path / "config.json"
    weights.write_text("old weights")
    config.write_text("old config")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write_all([(weights, lambda tmp: tmp.write_text("new weights")), (config, fail)])
    assert (weights.read_text(), config.read_text()) == ("old weights", "old config")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "weights.bin"]

    atomic_write_all([(weights, lambda tmp: tmp.write_text("new weights")), (config, lambda tmp: tmp.write_text("c"))])
    assert (weights.read_text(), config.read_text()) == ("new weights", "c")
    assert weights.stat().st_mtime_ns <= config.stat().st_mtime_ns


_WRITER = """
import sys
from pathlib import Path
from draftsync.files import atomic_write

path, letter, times = Path(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3])

def write(tmp):
    with open(tmp, "wb") as out:
        for _ in range(64):  # many small writes: a wide window for another writer to interleave
            out.write(letter * 4096)

for _ in range(times):
    atomic_write(path, write)
"""


def test_two_processes_writing_the_same_file_never_tear_it(tmp_path):
    path = tmp_path / "shared.bin"
    payloads = {letter.encode() * 4096 * 64 for letter in "AB"}
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), letter, "150"], stderr=subprocess.PIPE)
        for letter in "AB"
    ]
    reads = 0
    deadline = time.monotonic() + 120
    while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
        if path.exists():
            assert path.read_bytes() in payloads, "a reader saw a torn or partial file"
            reads += 1
    for writer in writers:
        _, stderr = writer.communicate(timeout=60)
        assert writer.returncode == 0, stderr.decode()
    assert reads > 0
    assert path.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["shared.bin"]


_BUILDER = """
import sys, time
from pathlib import Path
from draftsync.files import publish_directory

destination, letter = Path(sys.argv[1]), sys.argv[2]

def build(staging):
    for index in range(20):  # slowly: the other builder runs meanwhile
        (staging / f"part-{index}").write_text(letter)
        time.sleep(0.01)

print(publish_directory(destination, build))
"""


def test_two_processes_building_the_same_directory_both_end_with_one_whole_copy(tmp_path):
    destination = tmp_path / "target-abc"
    builders = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILDER, str(destination), letter], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for letter in "AB"
    ]
    for builder in builders:
        out, err = builder.communicate(timeout=120)
        assert builder.returncode == 0, err.decode()
        assert out.decode().strip() == str(destination)
    parts = sorted(destination.iterdir())
    assert [p.name for p in parts] == sorted(f"part-{i}" for i in range(20))
    assert len({p.read_text() for p in parts}) == 1, "the copy mixes both builders' files"
    assert [p.name for p in tmp_path.iterdir()] == ["target-abc"]  # no staging folder left


def test_a_build_that_raises_publishes_nothing_and_leaves_no_staging_folder(tmp_path):
    destination = tmp_path / "target-abc"

    def half_then_fail(staging: Path) -> None:
        (staging / "model.safetensors").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish_directory(destination, half_then_fail)
    assert list(tmp_path.iterdir()) == []


def test_a_published_directory_has_the_mode_of_one_made_in_place_and_can_be_a_folder_the_build_made(tmp_path):
    in_place = tmp_path / "in-place"
    in_place.mkdir()
    built = publish_directory(tmp_path / "built", lambda staging: (staging / "config.json").write_text("{}") and None)
    assert built.stat().st_mode == in_place.stat().st_mode  # not mkdtemp's 0700
    assert (built / "config.json").read_text() == "{}"

    def download(staging: Path) -> Path:
        inner = staging / "artifacts"
        inner.mkdir()
        (inner / "weights").write_text("w")
        return inner

    assert sorted(p.name for p in publish_directory(tmp_path / "downloaded", download).iterdir()) == ["weights"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built", "downloaded", "in-place"]
