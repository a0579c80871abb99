"""The wheel holds the product only: no generators, no patch bundler, no test profile, no harness, no tests.

The wheel is built by pip from a copy of the checkout's packaging inputs (the real pyproject.toml
and every top-level folder a wrong `packages.find` could pick up), so the build never writes into
the checkout the other tests read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.support.paths import REPO

COPIED = (
    "pyproject.toml",
    "README.md",
    "dspark-numeric-knobs.sh",
    ".env.dspark.example",
    "dspark_launch",
    "tools",
    "bench",
    "patches",
    "demo",
    "tests/support",
    "tests/vllm_ray_cpu_plugin",
)
DEV_ONLY = ("dspark_launch/config/generate.py", "dspark_launch/config/docs.py", "dspark_launch/hotfix/bundle.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "results", "build")
    for name in COPIED:
        source, target = REPO / name, src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=skip, symlinks=True)
        else:
            shutil.copy2(source, target)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("dspark_launch-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_the_product(wheel):
    names = wheel.namelist()
    assert "dspark_launch/cli/main.py" in names and "dspark_launch/hotfix/patch_tool.py" in names
    assert "dspark_launch/config/dspark-numeric-knobs.sh" in names  # package data still travels


def test_the_wheel_holds_no_dev_code(wheel):
    names = wheel.namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops <= {"dspark_launch"} | {t for t in tops if t.endswith(".dist-info")}, tops
    assert not [n for n in names if n in DEV_ONLY or "settings_codemod" in n or "scheduler_harness" in n]


def test_the_wheel_registers_no_test_profile(wheel):
    texts = {
        n: wheel.read(n).decode("utf-8", "replace")
        for n in wheel.namelist()
        if n.endswith((".py", ".txt", ".sh", ".example"))
    }
    assert not [n for n, text in texts.items() if "tiny-test" in text or "dspark_test_profiles" in text]
    entry_points = next(text for n, text in texts.items() if n.endswith(".dist-info/entry_points.txt"))
    assert "dspark_launch.profiles" not in entry_points


def test_the_test_profile_comes_from_the_entry_point_and_a_shipped_one_never_scans_for_it():
    code = (
        "from dspark_launch.config.text_settings import TextSettings\n"
        "from dspark_launch.profiles import catalog\n"
        "catalog.profile_named('deepseek-v4-flash-0731')\n"
        "print(catalog._registered.cache_info().misses)\n"
        "print(catalog.profile_named('tiny-test').name, catalog._registered.cache_info().misses)\n"
        "print(','.join(p.name for p in catalog.SHIPPED))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.splitlines() == ["0", "tiny-test 1", "deepseek-v4-flash-0731,none"]
