"""Files a user names are refused with the real cause (a folder is not 'missing', a link loop is not 'unreadable'),
through each place that reads one: profiles, the deployments file, a target checkpoint, and `--json` outputs, which
are checked before the command does its work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.profiles import profile
from draftsync.serving.deployment import load_deployments
from draftsync.speculative.target_description import read_target_config
from draftsync.user_files import check_output_file, path_problem, read_text, read_yaml
from typer.testing import CliRunner


@pytest.fixture
def places(tmp_path) -> dict[str, Path]:
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    plain = tmp_path / "plain.yaml"
    plain.write_text("train_steps: 3\n")
    loop_a, loop_b = tmp_path / "loop-a.yaml", tmp_path / "loop-b.yaml"
    loop_a.symlink_to(loop_b)
    loop_b.symlink_to(loop_a)
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(tmp_path / "gone.yaml")
    return {
        "folder": folder,
        "plain": plain,
        "loop": loop_a,
        "dangling": dangling,
        "missing": tmp_path / "missing.yaml",
        "under a file": plain / "inside.yaml",
    }


CAUSES = {
    "folder": "is a folder, not a file",
    "loop": "is a loop of symbolic links",
    "dangling": "is a symbolic link to",
    "missing": "does not exist",
    "under a file": "lies under a file, not a folder",
}


@pytest.mark.parametrize("kind", CAUSES)
def test_each_reader_names_the_real_cause(places, kind):
    path = places[kind]
    assert CAUSES[kind] in path_problem(path, "file")
    readers = {
        "a profile": lambda: profile(str(path)),
        "the deployments file": lambda: load_deployments(path),
        "read_text": lambda: read_text(path, "the file", "fix"),
    }
    for reader, read in readers.items():
        with pytest.raises(DraftsyncError) as refused:
            read()
        assert CAUSES[kind] in refused.value.what and str(path) in refused.value.what, reader


def test_a_checkpoint_that_is_a_file_or_a_loop_is_not_called_missing(places):
    with pytest.raises(DraftsyncError, match="is a file, not a folder"):
        read_target_config(places["plain"])
    with pytest.raises(DraftsyncError, match="is a loop of symbolic links"):
        read_target_config(places["loop"])


def test_a_file_that_is_not_utf8_or_not_yaml_is_one_line(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfetrain_steps: 3\n")
    with pytest.raises(DraftsyncError, match=r"is not UTF-8 text \(byte 0xff at offset 0\)"):
        profile(str(binary))
    broken = tmp_path / "broken.yaml"
    broken.write_text("deployments:\n  - name: [unclosed\n")
    with pytest.raises(DraftsyncError) as refused:
        read_yaml(broken, "deployments file", "fix")
    assert "\n" not in refused.value.what and "at line 3" in refused.value.what


def test_a_profile_file_of_any_extension_is_read_as_one(tmp_path):
    """`--profile prof.txt` was 'unknown sync profile'; an existing path is read as the file it is."""
    text = tmp_path / "prof.txt"
    text.write_text("train_steps: 7\n")
    assert profile(str(text)).train_steps == 7


def test_an_output_path_that_cannot_be_written_is_refused(places, tmp_path):
    for kind, cause in (("folder", "is a folder"), ("loop", "is a loop"), ("under a file", "is a file, not a folder")):
        with pytest.raises(DraftsyncError, match=cause):
            check_output_file(places[kind], "--json")
    check_output_file(tmp_path / "new" / "deeper" / "out.json", "--json")  # folders still to be made are made
    assert (tmp_path / "new" / "deeper").is_dir() and not (tmp_path / "new" / "deeper" / "out.json").exists()
    check_output_file(places["dangling"], "--json")  # written through the link, as the shell would
    with pytest.raises(DraftsyncError, match="cannot be made"):  # /proc takes no new folder, even from root
        check_output_file(Path("/proc/no-such-folder/out.json"), "--json")


def test_json_to_a_folder_is_refused_before_a_target_is_registered(workdir, built_targets, tmp_path):
    """It registered the version, then failed writing the JSON with a traceback."""
    from draftsync.cli.app import app
    from draftsync.tasks import context

    folder = tmp_path / "out"
    folder.mkdir()
    args = ["targets", "register", str(built_targets[1]), "--name", "json-llm", "--task-mix", "code=1"]
    result = CliRunner().invoke(app, [*args, "--json", str(folder)], env={"COLUMNS": "240"})
    assert result.exit_code == 2 and "is a folder, not a file" in result.output
    assert not context.registry().has_model("json-llm")
    assert os.listdir(folder) == []


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_scrape_refuses_a_named_deployments_file_it_cannot_read_in_one_error(workdir, places, kind):
    """A link loop or a dangling link as DRAFTSYNC_DEPLOYMENTS_FILE read as 'no deployments' and the scrape exited 0;
    the work dir's own default file may be absent, a file the user named may not. The terminal gets the error and its
    fix once, without Prefect's traceback of the failed flow."""
    env = {**os.environ, "DRAFTSYNC_DEPLOYMENTS_FILE": str(places[kind]), "COLUMNS": "240"}
    done = subprocess.run(
        [sys.executable, "-m", "draftsync.cli", "scrape"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stdout + done.stderr
    error = f"error: deployments file {places[kind]} {path_problem(places[kind], 'file')}"
    assert done.stderr.count(error) == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""


def test_scrape_with_no_deployments_file_in_the_work_dir_scrapes_nothing(workdir):
    from draftsync.cli.app import app

    result = CliRunner().invoke(app, ["scrape"], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["deployments"] == []


def test_a_json_write_that_fails_after_the_work_is_one_error_saying_the_work_is_done(workdir):
    """The path passes the check before the work, and the write still fails (a full disk: /dev/full); it was a raw
    OSError traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "draftsync.cli", "status", "--json", "/dev/full"],
        env={**os.environ, "COLUMNS": "240"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: --json /dev/full could not be written (No space left on device)" in done.stderr
    assert "work is done" in done.stderr and "Traceback" not in done.stderr
