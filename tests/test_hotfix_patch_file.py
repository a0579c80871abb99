"""The patch file: apply, check, status and revert on a copy of the real
installed vLLM scheduler.py (never on the installed file itself)."""

from __future__ import annotations

import json
import pathlib
import py_compile
import stat
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PATCH = REPO / "patches" / "hotfix-dsv4-issue27-partial-prefill-concurrency.py"

from dspark_launch.hotfix import patch_tool as patch  # noqa: E402
from dspark_launch.hotfix.contract import EXIT_UNSUPPORTED, SUPPORTED_RANGE  # noqa: E402


@pytest.fixture
def target(scheduler_copy):
    return scheduler_copy


def cli(*args: str, isolated: bool = True) -> tuple[int, dict]:
    """Run the patch file as a script; -I -S: no site-packages, so no vLLM."""
    flags = ["-I", "-S"] if isolated else []
    proc = subprocess.run(
        [sys.executable, *flags, str(PATCH), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def drift(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


# ---------------------------------------------------------------------------


def test_find_target_and_version_without_importing_vllm(installed_scheduler):
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('p', {str(PATCH)!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "t = m.find_target(); "
        "print(t, m.vllm_version(t), 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    path, version, imported = out.stdout.split()
    assert pathlib.Path(path) == installed_scheduler
    assert version == "0.32.0"
    assert imported == "False"


def test_status_apply_status_revert_cycle(target):
    original = target.read_bytes()
    before = patch.status(target)
    assert (before.code, before.state, before.vllm_version) == (1, "not-applied", "0.32.0")

    applied = patch.apply(target)
    assert (applied.code, applied.state, applied.changed) == (0, "applied", True)
    assert applied.sha256_before == patch._sha(original)
    assert applied.sha256_after == patch._sha(target.read_bytes()) != applied.sha256_before
    compile(target.read_bytes(), str(target), "exec")

    now = patch.status(target)
    assert (now.code, now.state, now.applied_patch_version) == (0, "applied", patch.PATCH_VERSION)
    assert now.original_sha256 == patch._sha(original)
    assert json.loads(json.dumps(now.to_dict()))["state"] == "applied"

    reverted = patch.revert(target)
    assert (reverted.code, reverted.state, reverted.changed) == (0, "not-applied", True)
    assert target.read_bytes() == original
    assert patch.status(target).code == 1


def test_apply_twice_is_a_no_op(target):
    first = patch.apply(target)
    data, mtime = target.read_bytes(), target.stat().st_mtime_ns
    second = patch.apply(target)
    assert (second.code, second.state, second.changed) == (0, "applied", False)
    assert "already applied" in second.message
    assert target.read_bytes() == data and target.stat().st_mtime_ns == mtime
    assert second.sha256_before == second.sha256_after == first.sha256_after


def test_revert_of_unpatched_file_changes_nothing(target):
    data = target.read_bytes()
    result = patch.revert(target)
    assert (result.code, result.state, result.changed) == (0, "not-applied", False)
    assert target.read_bytes() == data


def test_older_patch_version_is_reapplied_from_the_original(target):
    original = target.read_bytes()
    target.write_bytes(patch.render_patched(original, patch_version=patch.PATCH_VERSION - 1))

    old = patch.status(target)
    assert (old.code, old.state, old.applied_patch_version) == (3, "outdated", patch.PATCH_VERSION - 1)
    assert f"v{patch.PATCH_VERSION - 1}" in old.message

    upgraded = patch.apply(target)
    assert (upgraded.code, upgraded.state, upgraded.changed) == (0, "applied", True)
    assert target.read_bytes() == patch.render_patched(original)
    assert patch.revert(target).code == 0
    assert target.read_bytes() == original


@pytest.mark.parametrize(
    ("anchor", "old", "new"),
    [
        ("admission-guard", "if num_running >= self.max_num_active_reqs:", "if num_running >= self.max_active:"),
        ("waiting-section", "# Next, schedule the WAITING requests.", "# Then the waiting ones."),
        (
            "admission",
            "                request.num_computed_tokens = num_computed_tokens\n                self._set_kv_fetch_stage(request, None)",
            "                request.num_computed_tokens = int(num_computed_tokens)\n                self._set_kv_fetch_stage(request, None)",
        ),
        (
            "is_prefill_chunk update",
            "request.is_prefill_chunk = request.num_computed_tokens < (",
            "request.is_prefill_chunk = request.num_computed_tokens <= (",
        ),
    ],
)
def test_drifted_anchor_is_refused_and_the_file_left_alone(target, anchor, old, new):
    drift(target, old, new)
    data = target.read_bytes()
    for action in (patch.status, patch.check, patch.apply):
        result = action(target)
        assert (result.code, result.state) == (EXIT_UNSUPPORTED, "unsupported"), result
        assert "0.32.0" in result.message and f"'{anchor}'" in result.message
        assert target.read_bytes() == data
    assert not list(target.parent.glob("*.dspark-tmp"))


def test_version_outside_the_supported_range_is_refused(target):
    (major, minor) = SUPPORTED_RANGE[1]
    newer = f"{major}.{minor + 1}.0"
    version_file = target.parents[3] / "_version.py"
    version_file.write_text(version_file.read_text().replace("'0.32.0'", repr(newer)))
    data = target.read_bytes()
    result = patch.apply(target)
    assert (result.code, result.state) == (EXIT_UNSUPPORTED, "unsupported")
    assert newer in result.message
    assert target.read_bytes() == data


def test_foreign_patch_is_refused(target):
    with target.open("a") as handle:
        handle.write("\n# community patch: DSPARK_MAX_INFLIGHT_PREFILLS\n")
    data = target.read_bytes()
    assert (patch.status(target).code, patch.status(target).state) == (EXIT_UNSUPPORTED, "foreign")
    assert patch.apply(target).code == EXIT_UNSUPPORTED
    assert target.read_bytes() == data


def test_edited_patched_file_is_reported_and_revert_recovers(target):
    original = target.read_bytes()
    patch.apply(target)
    with target.open("a") as handle:
        handle.write("# local edit\n")
    data = target.read_bytes()
    assert (patch.status(target).code, patch.status(target).state) == (EXIT_UNSUPPORTED, "modified")
    assert patch.apply(target).code == EXIT_UNSUPPORTED and target.read_bytes() == data
    assert patch.revert(target).code == 0 and target.read_bytes() == original


def test_damaged_stored_original_refuses_revert(target):
    patch.apply(target)
    text = target.read_text()
    begin = text.index("# dspark-issue27-original-begin\n") + len("# dspark-issue27-original-begin\n")
    target.write_text(text[:begin] + "# AAAA\n" + text[begin:])
    data = target.read_bytes()
    for action in (patch.status, patch.apply, patch.revert):
        result = action(target)
        assert (result.code, result.state) == (EXIT_UNSUPPORTED, "damaged"), result
        assert target.read_bytes() == data


def test_file_mode_is_kept(target):
    target.chmod(0o640)
    patch.apply(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    target.chmod(0o604)
    patch.revert(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o604


def test_stale_bytecode_is_removed(target):
    for optimize in (-1, 2):
        py_compile.compile(str(target), doraise=True, optimize=optimize)
    assert len(patch.stale_bytecode(target)) == 2
    patch.apply(target)
    assert patch.stale_bytecode(target) == []
    py_compile.compile(str(target), doraise=True)
    patch.revert(target)
    assert patch.stale_bytecode(target) == []


def test_no_temp_files_left_behind(target):
    patch.apply(target)
    patch.revert(target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["scheduler.py"]


def test_cli_exit_codes(target):
    original = target.read_bytes()
    arg = ["--target", str(target)]
    code, out = cli("status", *arg)
    assert (code, out["state"], out["vllm_version"], out["target"]) == (1, "not-applied", "0.32.0", str(target))
    assert cli("check", *arg)[0] == 0
    assert cli("apply", *arg)[0] == 0
    assert cli("status", *arg)[0] == 0
    assert cli("apply", *arg)[0] == 0

    target.write_bytes(patch.render_patched(original, patch_version=patch.PATCH_VERSION - 1))
    assert cli("status", *arg)[0] == 3
    assert cli("apply", *arg)[0] == 0
    assert cli("revert", *arg)[0] == 0
    assert target.read_bytes() == original

    drift(target, "self.max_num_active_reqs:\n", "self.max_active:\n")
    code, out = cli("status", *arg)
    assert (code, out["state"]) == (EXIT_UNSUPPORTED, "unsupported")
    assert cli("check", *arg)[0] == EXIT_UNSUPPORTED
    assert cli("apply", *arg)[0] == EXIT_UNSUPPORTED


def test_cli_human_output_names_state_version_and_path(target):
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(PATCH), "status", "--target", str(target)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stdout.startswith("not-applied:")
    assert "0.32.0" in proc.stdout and str(target) in proc.stdout


@pytest.mark.parametrize("action", ["apply", "revert"])
def test_failed_bytecode_cleanup_after_the_write_says_the_file_changed(target, action):
    """Issue 14.11: the write and the clean-up are reported apart."""
    original = target.read_bytes()
    if action == "revert":
        patch.apply(target)
    # A directory where a .pyc would be: unlink() fails on it, even for root.
    stuck = target.parent / "__pycache__" / f"scheduler.{sys.implementation.cache_tag}.pyc"
    stuck.mkdir(parents=True)
    result = getattr(patch, action)(target)
    assert (result.code, result.changed) == (1, True), result
    assert result.state == ("applied" if action == "apply" else "not-applied")
    assert "left as it was" not in result.message
    assert "the file changed" in result.message and str(stuck) in result.message
    assert result.sha256_after == patch._sha(target.read_bytes())
    assert (target.read_bytes() == original) == (action == "revert")
    code, out = cli("status", "--target", str(target))
    assert out["state"] == result.state


def test_gate_without_its_marker_block_is_damaged_for_every_action(target):
    """Issue 14.12: the injected gate calls helpers that lived in the lost block."""
    patch.apply(target)
    text = target.read_text()
    target.write_text(text[: text.index("# >>> dspark-issue27 hotfix >>>")])
    data = target.read_bytes()
    for action in (patch.status, patch.check, patch.apply, patch.revert):
        result = action(target)
        assert (result.code, result.state) == (EXIT_UNSUPPORTED, "damaged"), (action.__name__, result)
        assert "no marker block" in result.message
        assert target.read_bytes() == data
    assert cli("revert", "--target", str(target))[0] == EXIT_UNSUPPORTED


@pytest.mark.parametrize("old_version", range(1, patch.PATCH_VERSION))
def test_upgrade_from_a_file_patched_by_an_older_release(target, tmp_path, old_version):
    """A node patched by each released script before this one: status says outdated
    (exit 3), apply re-patches from the stored original, revert restores it."""
    from tools.scheduler_harness import released_patch

    original = target.read_bytes()
    old_script = released_patch(old_version, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(old_script), "apply", "--target", str(target), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["patch_version"] == old_version, proc.stderr
    assert target.read_bytes() != original

    old = patch.status(target)
    assert (old.code, old.state, old.applied_patch_version) == (3, "outdated", old_version)
    assert cli("status", "--target", str(target))[0] == 3
    upgraded = patch.apply(target)
    assert (upgraded.code, upgraded.state, upgraded.changed) == (0, "applied", True)
    assert target.read_bytes() == patch.render_patched(original)
    assert patch.status(target).applied_patch_version == patch.PATCH_VERSION
    assert patch.revert(target).code == 0 and target.read_bytes() == original
