"""A rerun of the demo in the same work dir starts a fresh story: what the last one wrote is moved aside."""

from draftsync.cli.demo import STORY_STATE, _archive_previous_story


def test_a_rerun_moves_the_last_story_aside_and_keeps_the_caches(tmp_path):
    for name in STORY_STATE:
        (tmp_path / name).mkdir()
        (tmp_path / name / "kept.txt").write_text(name)
    (tmp_path / "cache").mkdir()  # built targets: reused by the next story

    archive = _archive_previous_story(tmp_path)

    assert archive is not None and archive.parent == tmp_path / "archive"
    for name in STORY_STATE:
        assert not (tmp_path / name).exists(), f"{name} was left for the next story"
        assert (archive / name / "kept.txt").read_text() == name
    assert (tmp_path / "cache").is_dir()
    # the training checkpoints would resume into the next story's data, its captured traffic join its retrain
    assert {"syncs", "traffic"} <= set(STORY_STATE)


def test_a_first_story_archives_nothing(tmp_path):
    assert _archive_previous_story(tmp_path) is None
    assert not (tmp_path / "archive").exists()
