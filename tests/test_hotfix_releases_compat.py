"""The hotfix against the scheduler.py of every vLLM release it supports.

Not in the default run (`-m "not compat"`): it downloads one vLLM wheel per
version (about 330 MB each) with `pip download --no-deps` into
$DSPARK_COMPAT_CACHE (default ~/.cache/dspark-compat), reusing wheels found
there. Run with: pytest -m compat tests/test_hotfix_releases_compat.py -s
"""

from __future__ import annotations

import os
import pathlib
import zipfile

import pytest

from dspark_launch.hotfix import layout
from dspark_launch.hotfix import patch_tool as patch
from dspark_launch.hotfix.contract import EXIT_UNSUPPORTED
from tests.support.compat_vllm import wheel_for
from tests.support.newest_vllm import UNDER_TEST_ENV
from tests.support.patched_overrides import first_chunk_overrides

pytestmark = pytest.mark.compat

# Every release from 0.25 to 0.34 (pip index versions vllm, December 2026).
VERSIONS = [
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
]
# A candidate release `tools/qualify_vllm.py` adds to the list (the same checks before it is declared).
if os.environ.get(UNDER_TEST_ENV) and os.environ[UNDER_TEST_ENV] not in VERSIONS:
    VERSIONS.append(os.environ[UNDER_TEST_ENV])
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
    # The seat guard comes before the gate in the same waiting loop (no loop starts between them; from 0.34 the loop's
    # loads-only switch reads it some lines up, and the admission check the patch puts first sits between).
    seat = text.rfind(guard, 0, gate_at)
    between = text[seat:gate_at].splitlines()[1:]
    assert seat >= 0 and len(between) <= 30, (seat, len(between))
    assert not any(line.lstrip().startswith(("while ", "for ")) for line in between), between
    assert patch.revert(target).code == 0
    assert target.read_bytes() == original

    with capsys.disabled():
        print(
            f"\n[issue27 compat] vllm {version}: check={checked.code} apply={applied.code} "
            f"compile=ok guard={guard} original_sha256={applied.original_sha256[:12]} "
            f"patched_sha256={applied.sha256_after[:12]}"
        )


@pytest.mark.parametrize("version", VERSIONS)
def test_no_release_gets_a_chunk_override_on_a_padded_request(version, tmp_path):
    """Every release from 0.25 pads a waiting request for speculative decoding (0.25-0.28 one indent less than
    0.29+): both first-chunk overrides carry `not pad_spec_decode`, after the flag's reset in the same loop."""
    text = extract(wheel_for(version), tmp_path).read_text()
    assert layout.pads(text)
    patched = layout.render_patched(text.encode()).decode()
    overrides = first_chunk_overrides(patched)
    assert len(overrides) == 2 and all("not pad_spec_decode" in line for line in overrides), overrides
    first_override = patched.index(overrides[0])
    assert patched.rindex("pad_spec_decode = False\n", 0, first_override) < patched.rindex(
        "pad_spec_decode = True\n", 0, first_override
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_each_release_with_an_unknown_padding_or_an_upstream_cap_is_refused(version, tmp_path):
    """On each release's own text: a partial-prefill cap of vLLM's own makes the hotfix step aside, and a
    padding it does not know (the flag set without its reset) makes it refuse; one line, file untouched."""
    target = extract(wheel_for(version), tmp_path)
    text = target.read_text()
    anchor = "        self.scheduler_config = vllm_config.scheduler_config\n"
    changed = {
        "upstream": text.replace(
            anchor, anchor + "        self._cap = self.scheduler_config.max_num_partial_prefills\n", 1
        ),
        "padding": text.replace("pad_spec_decode = False\n", "pad_spec_decode = bool(0)\n"),
    }
    for problem, variant in changed.items():
        assert variant != text
        target.write_text(variant)
        for action in (patch.check, patch.apply):
            result = action(target)
            assert result.code == EXIT_UNSUPPORTED and "\n" not in result.message, (problem, result)
            assert ("steps aside" if problem == "upstream" else "pad_spec_decode") in result.message, result
            assert target.read_text() == variant
