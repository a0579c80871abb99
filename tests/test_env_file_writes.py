"""Writing an env file (`dspark tune --apply`) touches only the line that sets the setting, and only while the file
is what the command read when it began: a line removed during a tune once made the writer rewrite the next line
(`VLLM_API_KEY=3`). Now the write is refused, nothing written, the key intact (docs/security.md, "The nodes' files")."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from dspark_launch.config import env_write
from dspark_launch.config.env_write import set_values, where_set
from dspark_launch.config.settings import resolve
from dspark_launch.errors import ConfigError
from dspark_launch.tune.points import Point
from dspark_launch.tune.tune import Tuner

KEY = "sk-keep-this-key-0123456789"
TEXT = (
    "DSPARK_HEAD_IP=127.0.0.1\n"
    "# the cap, tuned by hand\n"
    "DSPARK_MAX_INFLIGHT_PREFILLS=1\n"
    f"VLLM_API_KEY={KEY}\n"
    "DSPARK_PREFILL_GATE_MODE=1\n"
)
CAP = "DSPARK_MAX_INFLIGHT_PREFILLS"


def env_file(tmp_path, text: str = TEXT):
    path = tmp_path / ".env.dspark"
    path.write_text(text)
    path.chmod(0o600)
    return path


def changes_for(settings, path, values: dict[str, str]):
    return {name: (value, where_set(path, name, settings.source_of(name.lower()))) for name, value in values.items()}


def unchanged(path, before: bytes, inode: int) -> None:
    assert path.read_bytes() == before and path.stat().st_ino == inode
    assert [p.name for p in path.parent.iterdir()] == [path.name], "a temporary file was left behind"


def test_a_line_removed_during_a_tune_is_refused_and_the_key_kept(tmp_path):
    path = env_file(tmp_path)
    settings = resolve(env_file=str(path), environ={})  # what tune read when it began
    assert settings.source_of(CAP.lower()) == f"{path}:3"
    changes = changes_for(settings, path, {CAP: "3"})
    path.write_text(TEXT.replace("# the cap, tuned by hand\n", ""))  # the operator's edit while tune ran
    path.chmod(0o600)
    before, inode = path.read_bytes(), path.stat().st_ino
    with pytest.raises(ConfigError) as refused:
        set_values(path, changes, read_sha256=settings.env_file_sha256, note="set by dspark tune --apply")
    assert "changed since it was read" in str(refused.value) and "nothing written" in str(refused.value)
    assert KEY not in str(refused.value)
    unchanged(path, before, inode)
    assert f"VLLM_API_KEY={KEY}\n" in path.read_text()


def test_the_line_must_still_set_the_setting_even_when_the_hash_is_of_the_new_file(tmp_path):
    """The key on the line is checked on its own: line numbers of one reading, the file of another."""
    path = env_file(tmp_path)
    settings = resolve(env_file=str(path), environ={})
    changes = changes_for(settings, path, {CAP: "3"})
    path.write_text(TEXT.replace("# the cap, tuned by hand\n", ""))
    path.chmod(0o600)
    now = resolve(env_file=str(path), environ={})
    before, inode = path.read_bytes(), path.stat().st_ino
    with pytest.raises(ConfigError) as refused:
        set_values(path, changes, read_sha256=now.env_file_sha256)
    assert f"{path}:3 sets VLLM_API_KEY, not {CAP}" in str(refused.value) and KEY not in str(refused.value)
    unchanged(path, before, inode)
    # a line that is no assignment any more
    path.write_text("DSPARK_HEAD_IP=127.0.0.1\n# x\n# y\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=r":3 is not an assignment"):
        set_values(path, changes, read_sha256=resolve(env_file=str(path), environ={}).env_file_sha256)


def test_tune_apply_refuses_a_file_changed_since_tune_began(tmp_path):
    """The tune's own write (`Tuner._apply`) with the settings tune read: refused, nothing reloaded."""
    path = env_file(tmp_path)
    settings = resolve(env_file=str(path), environ={})
    reloaded = []
    tuner = SimpleNamespace(
        settings=settings, reporter=None, outcome=SimpleNamespace(applied=False), _reload=reloaded.append
    )
    path.write_text(TEXT.replace("# the cap, tuned by hand\n", ""))
    path.chmod(0o600)
    before, inode = path.read_bytes(), path.stat().st_ino
    with pytest.raises(ConfigError, match="changed since it was read"):
        Tuner._apply(tuner, SimpleNamespace(point=Point(3, 2)))  # type: ignore[arg-type]
    unchanged(path, before, inode)
    assert not reloaded and not tuner.outcome.applied


def test_an_edit_in_place_while_the_new_file_is_written_is_not_overwritten(tmp_path, monkeypatch):
    """The file is checked again just before the rename: an edit made after the first check wins."""
    path = env_file(tmp_path)
    settings = resolve(env_file=str(path), environ={})
    changes = changes_for(settings, path, {CAP: "2"})
    rewritten = env_write._rewritten

    def edited_meanwhile(*args, **kwargs):
        body = rewritten(*args, **kwargs)
        with open(path, "a") as out:  # in place, same inode
            out.write("MAX_NUM_SEQS=6\n")
        return body

    monkeypatch.setattr(env_write, "_rewritten", edited_meanwhile)
    with pytest.raises(ConfigError, match="changed since it was read"):
        set_values(path, changes, read_sha256=settings.env_file_sha256)
    assert path.read_text() == TEXT + "MAX_NUM_SEQS=6\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_an_unchanged_file_is_written_and_an_alias_line_counts_as_the_setting(tmp_path):
    text = TEXT.replace(f"{CAP}=1", "export DSPARKMAXINFLIGHTPREFILLS='1'  # alias")
    path = env_file(tmp_path, text)
    path.chmod(0o640)
    settings = resolve(env_file=str(path), environ={})
    set_values(
        path,
        changes_for(settings, path, {CAP: "2", "DSPARK_PREFILL_GATE_MODE": "2"}),
        read_sha256=settings.env_file_sha256,
    )
    assert path.read_text() == text.replace("'1'", "'2'").replace("GATE_MODE=1", "GATE_MODE=2")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and os.listdir(tmp_path) == [path.name]
