"""Issue 27 patch against the scheduler.py of every vLLM release it supports.

Not in the default run (`-m "not compat"`): it downloads one vLLM wheel per
version (about 330 MB each) with `pip download --no-deps` into
$DSPARK_COMPAT_CACHE (default ~/.cache/dspark-compat), reusing wheels found
there. Run with: pytest -m compat tests/test_issue27_compat.py -s
"""

from __future__ import annotations

import pathlib
import zipfile

import pytest

from dspark_launch.hotfix import patch_tool as patch
from tests.support.compat_vllm import wheel_for

pytestmark = pytest.mark.compat

VERSIONS = ["0.25.0", "0.26.0", "0.27.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]
MEMBERS = ("vllm/v1/core/sched/scheduler.py", "vllm/_version.py")


def extract(wheel: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    with zipfile.ZipFile(wheel) as archive:
        for member in MEMBERS:
            out = dest / member
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(archive.read(member))
    return dest / MEMBERS[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_patch_applies_to_release(version, tmp_path, capsys):
    target = extract(wheel_for(version), tmp_path)
    original = target.read_bytes()

    checked = patch.check(target)
    assert (checked.code, checked.state, checked.vllm_version) == (0, "not-applied", version), checked
    applied = patch.apply(target)
    assert (applied.code, applied.state) == (0, "applied"), applied
    patched = target.read_bytes()
    compile(patched, str(target), "exec")
    assert patch.status(target).code == 0

    text = patched.decode()
    guard = "max_num_active_reqs" if version >= "0.31" else "max_num_running_reqs"
    gate_at = text.index("                if (  # dspark-issue27\n")
    assert guard in text[gate_at - 400 : gate_at]
    assert patch.revert(target).code == 0
    assert target.read_bytes() == original

    with capsys.disabled():
        print(
            f"\n[issue27 compat] vllm {version}: check={checked.code} apply={applied.code} "
            f"compile=ok guard={guard} original_sha256={applied.original_sha256[:12]} "
            f"patched_sha256={applied.sha256_after[:12]}"
        )
