# dspark-launch: `make test` sets everything up from nothing; `make demo` runs the main job.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dspark-stack
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (each with its own two-node testbed); 0 runs the suite in this process.
PYTEST_WORKERS ?= 3

.PHONY: test test-stack test-compat coverage demo demo-down bench-cli venv testbed-deps clean

venv: $(STAMP)

# The CPU test stack. torch==2.13.0+cpu is not on PyPI: pip finds it through its own
# configuration on these machines; elsewhere export PIP_EXTRA_INDEX_URL=<PyTorch's CPU index>.
$(STAMP): pyproject.toml $(wildcard tests/vllm_ray_cpu_plugin/pyproject.toml)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cpu,test]'
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm.config` beside torch+cpu.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	@if [ -f tests/vllm_ray_cpu_plugin/pyproject.toml ]; then $(PY) -m pip install -q --no-deps -e tests/vllm_ray_cpu_plugin; fi
	touch $(STAMP)

# The two-node testbed needs sshd (Debian openssh-server) when run as root, the model copy rsync, and the container
# tests podman with runc (crun 1.8 refuses this cgroup v1/v2 hybrid host), catatonit (--init) and zstd (the image).
TESTBED_PACKAGES := openssh-server rsync podman runc catatonit zstd
testbed-deps:
	@if [ "$$(id -u)" = 0 ] && { [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/bin/rsync ] || [ ! -x /usr/bin/podman ] || [ ! -x /usr/bin/runc ] \
			|| [ ! -x /usr/libexec/podman/catatonit ] || [ ! -x /usr/bin/zstd ]; }; then \
		printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(TESTBED_PACKAGES); \
		rc=$$?; rm -f /usr/sbin/policy-rc.d; exit $$rc; \
	fi

# mypy first (config in pyproject.toml: strict on the agent protocol, the settings and the deployment records);
# Three workers on two cores, a module at a time each, the long modules first (tests/support/suite_order.py): a
# testbed life waits on sockets, SSH and process starts much of the time, the others fill it (measured on 2 cores:
# pytest 1,715 s on two workers, 1,456 s on three, memory never the limit).
# --durations: the 25 slowest tests at the end of every run; the seconds per module follow.
# Byte-compiled first, as pip compiles an installed package: an editable install is not, and where the environment sets
# PYTHONDONTWRITEBYTECODE (these sandboxes do) every CLI call compiled its serve/ and cluster/ modules again (measured:
# a serving test's 8 CLI calls 5.0 -> 4.4 CPU-s). Quiet (-q): it prints only a file it cannot compile.
# The newest vLLM release's own Python (its CUDA wheel, ~240 MB once into ~/.cache/dspark-compat, unpacked beside it):
# the hotfix and the dry boot run on its scheduler and config code too (tests/support/newest_vllm.py).
# Then the room on disk for the rest (the container test image, the run's files): one line and exit 2 when short,
# before a run that would fail late on ENOSPC (tests/support/disk_room.py).
test: $(STAMP) testbed-deps
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m tests.support.newest_vllm
	$(PY) -m tests.support.disk_room
	$(PY) -m compileall -q -j 0 dspark_launch tests/support tests/vllm_ray_cpu_plugin tools
	$(PY) -m pytest -m "not compat and not stack" -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# The test stack alone (vLLM CPU, Ray and the test platform plugin serving TP 2 on 127.0.0.1, no launcher): what
# every testbed life in `make test` runs too, so it is left out there; run it first when the testbed fails to serve.
test-stack: $(STAMP)
	$(PY) -m pytest -m stack $(PYTEST_ARGS)

# Downloaded vLLM releases (not in `make test`): the hotfix against the wheels 0.25 to 0.34 ($DSPARK_COMPAT_CACHE,
# default ~/.cache/dspark-compat, ~330 MB each), and the dry boot on 0.33 in a venv built once outside the checkout
# ($DSPARK_COMPAT_VENVS, default /var/tmp/dspark-compat, ~3.7 GB; tests/support/compat_vllm.py).
test-compat: $(STAMP)
	$(PY) -m pytest -m compat $(PYTEST_ARGS)

# Line coverage of dspark_launch/ by the suite, node agents and vllm serve included (tools/suite_coverage.py;
# installs coverage.py into the venv on first use; not part of `make test`).
coverage: $(STAMP) testbed-deps
	$(PY) -m tools.suite_coverage run -- $(PYTEST_ARGS)
	$(PY) -m tools.suite_coverage report --json bench/results/suite-coverage.json

bench-cli: $(STAMP)
	$(PY) bench/cli_startup.py

# The main job on an embedded default: two network-namespace "Sparks" on this machine,
# real SSH, real Ray, vLLM (CPU) serving a tiny local model with tensor parallel 2.
demo: $(STAMP) testbed-deps
	$(PY) -m demo up

demo-down:
	$(PY) -m demo down

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache
