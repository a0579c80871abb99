"""Container mode ships the launcher's package into each worker's state folder: the folder is checked
first with host mode's rules, and a copy is used only for its content, never its name (docs/security.md). Runs the real host half (`python3 -c`) through a LocalHost; no container started."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from dspark_launch.agent.host_shell import LocalHost
from dspark_launch.cluster.container_engine import ContainerError, ship_package
from tests.support.paths import REPO

PACKAGE = REPO / "dspark_launch"
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")


@pytest.fixture
def package(tmp_path) -> Path:
    """A copy of the package (the test changes nothing in the checkout), without caches."""
    copy = tmp_path / "src" / "dspark_launch"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def _same_tree(a: Path, b: Path) -> bool:
    files = lambda root: {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}  # noqa: E731
    return files(a) == files(b)


def test_a_planted_copy_with_a_modified_file_is_never_used(tmp_path, package):
    state = tmp_path / "state"
    shipped = Path(ship_package(LocalHost(), str(package), str(state)))
    assert shipped.parent.parent == state and shipped.parent.name.startswith("agent-")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and _same_tree(shipped, package)
    assert Path(ship_package(LocalHost(), str(package), str(state))) == shipped  # reused: same content
    agent = shipped / "agent" / "node_end.py"
    agent.write_text(agent.read_text() + "\nimport os; os.system('touch /tmp/pwned')\n")  # planted code
    assert Path(ship_package(LocalHost(), str(package), str(state))) == shipped
    assert _same_tree(shipped, package)  # shipped again: the planted line is gone
    (shipped / "agent" / "extra.py").write_text("print('planted')\n")
    ship_package(LocalHost(), str(package), str(state))
    assert not (shipped / "agent" / "extra.py").exists() and _same_tree(shipped, package)
    agent.unlink()
    agent.symlink_to(tmp_path / "elsewhere.py")
    ship_package(LocalHost(), str(package), str(state))
    assert not agent.is_symlink() and _same_tree(shipped, package)
    assert [p.name for p in state.iterdir()] == [shipped.parent.name]  # nothing left beside it


def test_the_checkout_package_ships_with_its_link_stored_as_a_file(tmp_path):
    assert (PACKAGE / "config" / "env.dspark.example").is_symlink()  # a link out of the package, in a checkout
    shipped = Path(ship_package(LocalHost(), str(PACKAGE), str(tmp_path / "state")))
    example = shipped / "config" / "env.dspark.example"
    assert not example.is_symlink() and example.read_bytes() == (REPO / ".env.dspark.example").read_bytes()


def test_a_copy_is_named_by_its_content(tmp_path, package):
    state = tmp_path / "state"
    first = ship_package(LocalHost(), str(package), str(state))
    (package / "agent" / "node_end.py").write_text("# another version\n")
    second = ship_package(LocalHost(), str(package), str(state))
    assert first != second and (Path(second) / "agent" / "node_end.py").read_text() == "# another version\n"


@needs_root
def test_an_unsafe_state_folder_is_refused_before_anything_is_shipped(tmp_path, package):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    above = tmp_path / "above"
    above.mkdir()
    above.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    (tmp_path / "target").mkdir(mode=0o700)
    for state, why in (
        (theirs, f"owned by uid {NOBODY}"),
        (open_folder, "mode 0777"),
        (above / "state", "could replace"),
        (link, "symbolic link"),
    ):
        with pytest.raises(ContainerError) as caught:
            ship_package(LocalHost(), str(package), str(state))
        message = str(caught.value)
        assert str(state) in message and why in message and "nothing was started" in message, message
        assert "\n" not in message
    assert list(theirs.iterdir()) == [] and list(open_folder.iterdir()) == [] and not (above / "state").exists()
    assert list((tmp_path / "target").iterdir()) == []
