"""pytest fixtures for the namespace testbed.

Import them from tests/conftest.py::

    from tests.support.testbed.fixture import testbed, testbed_clean  # noqa: F401

``testbed`` (session scope) builds the nodes once and tears them down at the end
of the session, failures included. When the machine cannot host it (not root, no
namespaces, no overlayfs, sshd not installable...) the tests using it are skipped
with the reason, or fail when DSPARK_TESTBED_REQUIRED=1 (set it in CI so a broken
set-up cannot pass as "skipped").

``testbed_clean`` (function scope) is the same testbed, reset after the test: every
process but the testbed's own killed, links up, sshd running, venv overlays pristine.

Each pytest process gets its own testbed (state dir /tmp/dspt-<pid>, netns names
dspt<pid>-head ...), so two sessions on one machine (or pytest-xdist workers) never
share or tear down each other's nodes; testbeds left by a pytest that died (its
pid gone) are swept before a new one is built. The fabric addresses are the same
in every testbed (10.213.0.x): each has its own bridge, they never meet.

Settings (environment): DSPARK_TESTBED_NODES (default 2), DSPARK_TESTBED_VENV
(default: the venv running pytest), DSPARK_TESTBED_REQUIRED=1 (fail, don't skip).
"""

from __future__ import annotations

import atexit
import os
import re

import pytest

from tests.support.processes import alive as _alive
from tests.support.testbed.testbed import (
    SSHD,
    Testbed,
    TestbedError,
    default_venv,
    ensure_openssh_server,
    requirements_met,
)

# family -> (netns prefix + pid, state dir /tmp/<family>-<pid>)
#   dspt: the session fixture's testbed; dspx: extra_testbed() (e.g. a 3-node run)
FAMILIES = ("dspt", "dspx")

# One testbed per pytest process, shared even if this module's fixtures end up
# registered twice (conftest import plus a test module import).
_shared = {"tb": None, "users": 0, "error": None}


def _settings(pid: int = 0, family: str = "dspt", nodes: int = 0) -> dict:
    pid = pid or os.getpid()
    return {
        "state_dir": f"/tmp/{family}-{pid}",
        "prefix": f"{family}{pid}",
        "nodes": nodes or int(os.environ.get("DSPARK_TESTBED_NODES", "2")),
        "venv": default_venv(),
    }


def extra_testbed(nodes: int = 3) -> Testbed:
    """A second testbed of this pytest process (not up yet; call up(), and down() in a finally).

    Swept like the session one if pytest dies. Only one at a time per process."""
    return Testbed(**_settings(family="dspx", nodes=nodes))


def sweep_stale() -> list:
    """Tear down testbeds left by pytest processes that are gone. Returns their (family, pid)."""
    found = set()
    netns = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    for fam in FAMILIES:
        pat = re.compile(rf"^{fam}(\d+)-(head|worker\d+|fabric)$")
        found |= {(fam, int(m.group(1))) for m in map(pat.match, netns) if m}
        pat = re.compile(rf"^{fam}-(\d+)$")
        found |= {(fam, int(m.group(1))) for m in map(pat.match, os.listdir("/tmp")) if m}
    swept = []
    for fam, pid in sorted(found):
        if pid == os.getpid():
            continue
        tb = Testbed(**_settings(pid, fam))
        owner = tb.owner_alive()
        if owner or (owner is None and _alive(pid)):
            continue  # a live pytest's testbed (or no record and its pid runs): leave it
        tb.down()
        swept.append((fam, pid))
    return swept


def _unavailable(reason: str):
    if os.environ.get("DSPARK_TESTBED_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"testbed required but unavailable: {reason}", pytrace=False)
    pytest.skip(f"testbed unavailable: {reason}")


def _teardown() -> None:
    tb = _shared["tb"]
    _shared["tb"] = None
    if tb is not None:
        tb.down()


def _acquire() -> Testbed:
    if _shared["error"]:
        _unavailable(_shared["error"])
    if _shared["tb"] is None:
        cfg = _settings()
        ok, why = requirements_met(cfg["venv"])
        if not ok and SSHD in why and os.geteuid() == 0:
            try:
                ensure_openssh_server()
            except TestbedError as exc:
                why = str(exc)
            else:
                ok, why = requirements_met(cfg["venv"])
        if not ok:
            _shared["error"] = why
            _unavailable(why)
        try:
            sweep_stale()
        except (OSError, TestbedError):
            pass
        tb = Testbed(**cfg)
        try:
            tb.up()
        except TestbedError as exc:
            _shared["error"] = f"up failed: {exc}"
            pytest.fail(f"testbed up failed: {exc}", pytrace=False)
        _shared["tb"] = tb
        atexit.register(_teardown)  # backstop; normally the session finalizer runs first
    _shared["users"] += 1
    return _shared["tb"]


def _release() -> None:
    _shared["users"] -= 1
    if _shared["users"] <= 0:
        _teardown()


@pytest.fixture(scope="session")
def testbed():
    """The N-node namespace testbed (tests.support.testbed.testbed.Testbed), up for the whole session."""
    tb = _acquire()
    try:
        yield tb
    finally:
        _release()


@pytest.fixture
def testbed_clean(testbed):
    """The session testbed, reset to a fresh state after the test."""
    yield testbed
    testbed.reset()
