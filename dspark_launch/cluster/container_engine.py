"""One long-lived container per node (DSPARK_RUNTIME=docker|podman): create, inspect, remove.

The container is the node: Ray, the hotfix and `vllm serve` run inside it through the
agent (container_transport.ContainerTransport). It runs an idle init (`sleep infinity`
under `--init`) on the host's network and IPC namespaces, with the GPU, the RDMA devices
and unlimited locked memory, the state folder and model cache mounted at their host
paths (so every path the launcher records means the same file inside and outside), and
the launcher's own package mounted read-only at AGENT_MOUNT (the image is used as
published). Its name and the label `dspark.owner` come from the deployment's marker,
so `down` removes exactly ours; removing it ends every process inside.

The container engine (docker or podman, DSPARK_RUNTIME) and its CLI: everything here runs that CLI on the
node's host through a HostShell.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from dspark_launch.agent.container_transport import AGENT_MOUNT, ContainerTransport, OneShotContainerTransport
from dspark_launch.agent.host_shell import HostShell
from dspark_launch.config.container_args import refused_flag
from dspark_launch.errors import ConfigError, DsparkError
from dspark_launch.node.safe_path import CONTAINER_STATE_VAR, within

RUNTIMES = ("docker", "podman")  # DSPARK_RUNTIME besides "host"
OWNER_LABEL = "dspark.owner"
# A digest of everything the container was created from (image id, mounts, arguments): an unchanged
# one is reused by the next start, so the JIT caches and the container's own state stay warm.
SPEC_LABEL = "dspark.spec"
# The JIT compile caches kept across container re-creation, each a sub-folder of the node's JIT cache
# folder (mounted at its host path). MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark keeps the same
# on its cache volume (docker-compose.dspark.yml): the DeepSeek-V4 compile can exceed 300 s.
JIT_CACHE_VARS = (
    ("VLLM_CACHE_ROOT", "vllm"),  # vllm/envs.py: torch.compile artifacts, kernel tuning
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),  # FlashInfer's JIT modules (.cache/flashinfer below it)
    ("TRITON_CACHE_DIR", "triton"),  # triton/knobs.py
    ("TILELANG_CACHE_DIR", "tilelang"),  # TileLang kernels (the DeepSeek-V4 recipes' TileLang backend)
    ("CUTE_DSL_CACHE_DIR", "cute-dsl"),  # CUTLASS CuTe DSL compiled kernels
    ("B12X_CUTE_COMPILE_CACHE_DIR", "b12x-cute"),  # the b12x MoE backend's CuTe DSL cache (MiaAI's compose)
)
# Test-only: replaces the GPU/RDMA arguments below (no GPU, no CAP_SYS_RESOURCE in CI).
# Read from the launcher's process environment only, never from an env file, and honoured only
# where the test platform is installed and switched on (TEST_PLATFORM_VAR=1): see test_hook_allowed.
TEST_GPU_ARGS_VAR = "DSPARK_TEST_CONTAINER_GPU_ARGS"
TEST_PLATFORM_VAR = "DSPARK_TEST_RAY_CPU_PLATFORM"  # switches tests/vllm_ray_cpu_plugin on
TEST_PLATFORM_MODULE = "dspark_ray_cpu_platform"
GPU_ARGS = {
    "docker": ("--gpus", "all"),  # NVIDIA Container Toolkit's runtime hook
    "podman": ("--device", "nvidia.com/gpu=all"),  # CDI spec from `nvidia-ctk cdi generate`
}
# RoCE verbs devices and unlimited locked memory for NCCL over RDMA.
RDMA_ARGS = ("--device", "/dev/infiniband", "--ulimit", "memlock=-1:-1")
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")


class ContainerError(DsparkError):
    """A container runtime command failed on a node."""


class ImageMismatch(DsparkError):
    """The nodes would run different images (or one lacks it): nothing is started."""


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """What one node's container is made of (the same on every node but the host paths' owner)."""

    runtime: str  # "docker" | "podman"
    image: str  # DSPARK_IMAGE: tag or name@sha256:digest
    marker: str  # the deployment's marker: container name and owner label
    agent_package: str  # host folder of the dspark_launch package, mounted read-only
    state_dir: str  # host state folder, mounted at the same path
    model_cache: str = ""  # host Hugging Face cache (HF_HOME), mounted at the same path; "" = none
    python: str = "python3"  # the image's interpreter
    extra_args: tuple[str, ...] = ()  # DSPARK_CONTAINER_ARGS, already split
    hardware_args: tuple[str, ...] = ()  # from hardware_args(); GPU + RDMA in production
    jit_cache: str = ""  # host folder of the JIT compile caches, mounted at the same path; "" = none

    @property
    def name(self) -> str:
        return container_name(self.marker)


@dataclass(frozen=True)
class ImageIdentity:
    node: str
    reference: str
    image_id: str  # "sha256:<64 hex>"; "" when the image is not on the node
    repo_digests: tuple[str, ...] = ()

    @property
    def present(self) -> bool:
        return bool(self.image_id)


@dataclass(frozen=True)
class ContainerState:
    name: str
    status: str  # the runtime's word: running, exited, created, paused, ...; "absent" when there is none
    image_id: str  # "sha256:<64 hex>", "" when absent
    owner: str  # its dspark.owner label
    spec_digest: str = ""  # its dspark.spec label: what it was created from
    reused: bool = False  # `up` found it running as `spec` asks and kept it

    @property
    def running(self) -> bool:
        return self.status == "running"


def container_name(marker: str) -> str:
    if not marker.startswith("dspark-") or not _NAME.match(marker):
        raise ValueError(f"refusing to name a container from marker {marker!r}")
    return marker


def hardware_args(runtime: str, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """GPU, RDMA and memlock arguments for `runtime`; the test hook replaces them all when set (and allowed)."""
    if TEST_GPU_ARGS_VAR in environ:
        test_hook_allowed(environ)
        return tuple(shlex.split(environ[TEST_GPU_ARGS_VAR]))
    return GPU_ARGS[runtime] + RDMA_ARGS


def test_hook_allowed(environ: Mapping[str, str]) -> None:
    """The test hook passes raw `run` arguments past the DSPARK_CONTAINER_ARGS refusals: only on the
    test platform (its plugin installed and switched on); anywhere else it is exit 2, never ignored."""
    import importlib.util

    if environ.get(TEST_PLATFORM_VAR) != "1" or importlib.util.find_spec(TEST_PLATFORM_MODULE) is None:
        raise ConfigError(
            f"{TEST_GPU_ARGS_VAR} from the environment is a test hook; allowed: only on the test "
            f"platform ({TEST_PLATFORM_VAR}=1 with tests/vllm_ray_cpu_plugin installed); unset it"
        )


def _mount_targets(words: Sequence[str]) -> list[str]:
    """Container-side targets of -v/--volume/--mount among `words`."""
    targets = []
    for i, word in enumerate(words):
        flag, _, inline = word.partition("=")
        if flag not in ("-v", "--volume", "--mount"):
            continue
        value = inline or (words[i + 1] if i + 1 < len(words) else "")
        if flag == "--mount":
            fields = dict(part.partition("=")[::2] for part in value.split(","))
            targets.append(fields.get("target") or fields.get("dst") or fields.get("destination", ""))
        else:
            parts = value.split(":")
            targets.append(parts[1] if len(parts) > 1 else parts[0])
    return [t.rstrip("/") or "/" for t in targets if t]  # "/x/" is "/x"; "/" stays "/"


def check_spec(spec: ContainerSpec) -> None:
    """ConfigError (exit 2) for settings that would defeat the launcher's own container arguments."""
    if spec.runtime not in RUNTIMES:
        raise ConfigError(f"DSPARK_RUNTIME={spec.runtime!r}: allowed host, docker, podman")
    if not spec.image:
        raise ConfigError(f"DSPARK_IMAGE is empty: DSPARK_RUNTIME={spec.runtime} needs an image (tag or digest)")
    refused = refused_flag(list(spec.extra_args))
    if refused:
        raise ConfigError(f"DSPARK_CONTAINER_ARGS: {refused[0]} is not allowed ({refused[1]})")
    ours = {AGENT_MOUNT, spec.state_dir.rstrip("/"), spec.model_cache.rstrip("/"), spec.jit_cache.rstrip("/")} - {""}
    for target in _mount_targets(spec.extra_args):
        if any(within(mine, target) or within(target, mine) for mine in ours):
            raise ConfigError(
                f"DSPARK_CONTAINER_ARGS: a mount at {target} would cover the launcher's own ({', '.join(sorted(ours))})"
            )


def run_argv(spec: ContainerSpec) -> list[str]:
    """The `run` command that creates the node's container, labelled with the digest of the rest of it."""
    argv = _create_argv(spec)
    label = argv.index(f"{OWNER_LABEL}={spec.marker}")
    return argv[: label + 1] + ["--label", f"{SPEC_LABEL}={spec_digest(spec)}"] + argv[label + 1 :]


def spec_digest(spec: ContainerSpec) -> str:
    """Equal for two specs exactly when their containers would be created alike (image id, mounts,
    environment, arguments)."""
    return hashlib.sha256(json.dumps(_create_argv(spec)).encode()).hexdigest()[:16]


def jit_env(jit_cache: str) -> list[str]:
    return [f"{var}={jit_cache.rstrip('/')}/{sub}" for var, sub in JIT_CACHE_VARS] if jit_cache else []


def _create_argv(spec: ContainerSpec) -> list[str]:
    mounts = [
        "--volume",
        f"{spec.agent_package}:{AGENT_MOUNT}/dspark_launch:ro",
        "--volume",
        f"{spec.state_dir}:{spec.state_dir}",
    ]
    # The agent (root in a rootful runtime) keeps the logs in the state folder for that folder's owner.
    env = ["--env", f"PYTHONPATH={AGENT_MOUNT}", "--env", f"{CONTAINER_STATE_VAR}={spec.state_dir}"]
    if spec.model_cache:
        # Read-only and without HF_HOME: model code in the container can neither rewrite the host's weights
        # and manifests nor find a hub token there (the serve spec points HF_HUB_CACHE at the hub cache).
        mounts += ["--volume", f"{spec.model_cache}:{spec.model_cache}:ro"]
    if spec.jit_cache:
        mounts += ["--volume", f"{spec.jit_cache}:{spec.jit_cache}"]
        env += [word for pair in jit_env(spec.jit_cache) for word in ("--env", pair)]
    # --pull never: the image was checked on every node before; a run never fetches another.
    return [
        spec.runtime,
        "run",
        "--detach",
        "--pull",
        "never",
        "--name",
        spec.name,
        "--label",
        f"{OWNER_LABEL}={spec.marker}",
        "--network",
        "host",
        "--ipc",
        "host",
        "--init",
        *spec.hardware_args,
        *mounts,
        *env,
        *spec.extra_args,
        "--entrypoint",
        "sleep",
        spec.image,
        "infinity",
    ]


def oneshot_run_args(spec: ContainerSpec) -> tuple[str, ...]:
    """`run --rm` arguments of a short-lived container for the model checks: the launcher's package, the
    state folder and the model cache (read-only, at the host path), no network, our label; nothing else
    of the node's. The state folder's owner is whom the model folder check trusts besides root, as in
    the node container (agent.model_folder.trusted_owner)."""
    args = [
        "--pull",
        "never",
        "--network",
        "none",
        "--label",
        f"{OWNER_LABEL}={spec.marker}-model",
        "--volume",
        f"{spec.agent_package}:{AGENT_MOUNT}/dspark_launch:ro",
        "--volume",
        f"{spec.state_dir}:{spec.state_dir}:ro",
        "--env",
        f"PYTHONPATH={AGENT_MOUNT}",
        "--env",
        f"{CONTAINER_STATE_VAR}={spec.state_dir}",
    ]
    if spec.model_cache:
        args += ["--volume", f"{spec.model_cache}:{spec.model_cache}:ro"]
    return tuple(args)


def oneshot_transport(host: HostShell, spec: ContainerSpec) -> OneShotContainerTransport:
    """The agent in a `--rm` container from `spec.image` (the checked id) on the node's host; the model
    cache folder is created first (a runtime refuses a missing bind source)."""
    if spec.model_cache:
        _run(host, ["mkdir", "-p", "-m", "700", spec.model_cache], 30, "creating the model cache folder")
    return OneShotContainerTransport(
        host=host, runtime=spec.runtime, image=spec.image, run_args=oneshot_run_args(spec), python=spec.python
    )


def _run(host: HostShell, argv: Sequence[str], timeout: float, what: str) -> str:
    proc = host.run(argv, timeout=timeout)
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise ContainerError(f"{host.description}: {what} failed: {detail}")
    return proc.stdout


def _sha256(image_id: str) -> str:
    """podman prints ids bare, docker with "sha256:"; one form for comparing and showing."""
    image_id = image_id.strip()
    return image_id if not image_id or image_id.startswith("sha256:") else f"sha256:{image_id}"


def resolve_image(host: HostShell, runtime: str, image: str, node: str, timeout: float = 60) -> ImageIdentity:
    """The image's id on that node (never pulled here: a missing image is a typed answer, not an error)."""
    proc = host.run([runtime, "image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", image], timeout=timeout)
    if proc.returncode != 0:
        return ImageIdentity(node=node, reference=image, image_id="")
    image_id, _, digests = proc.stdout.strip().partition(" ")
    return ImageIdentity(
        node=node, reference=image, image_id=_sha256(image_id), repo_digests=tuple(json.loads(digests or "null") or ())
    )


def check_same_image(identities: Sequence[ImageIdentity]) -> str:
    """The one image id all nodes hold; ImageMismatch (exit 1) naming each node's when not."""
    missing = [i.node for i in identities if not i.present]
    if missing:
        raise ImageMismatch(
            f"image {identities[0].reference} is not on {', '.join(missing)} (pull or load it there first)"
        )
    ids = {i.image_id for i in identities}
    if len(ids) != 1:
        shown = ", ".join(f"{i.node} {i.image_id[:19]}" for i in identities)
        raise ImageMismatch(f"image {identities[0].reference} differs between nodes: {shown}")
    return ids.pop()


def inspect(host: HostShell, runtime: str, name: str, timeout: float = 30) -> ContainerState:
    fmt = (
        '{{.State.Status}} {{.Image}} {{index .Config.Labels "' + OWNER_LABEL + '"}} '
        '{{index .Config.Labels "' + SPEC_LABEL + '"}}'
    )
    proc = host.run([runtime, "container", "inspect", "--format", fmt, name], timeout=timeout)
    if proc.returncode != 0:
        return ContainerState(name=name, status="absent", image_id="", owner="")
    status, image_id, owner, digest = (proc.stdout.strip().split(" ") + ["", "", "", ""])[:4]
    digest = "" if digest == "<no value>" else digest
    return ContainerState(name=name, status=status, image_id=_sha256(image_id), owner=owner, spec_digest=digest)


def down(host: HostShell, runtime: str, marker: str, grace_s: int = 10, timeout: float = 60) -> bool:
    """Remove our container of `marker` (processes inside get SIGTERM, SIGKILL after grace_s).

    Returns whether one was there. A container of that name without our label is left
    alone (ContainerError): it is not ours.
    """
    name = container_name(marker)
    state = inspect(host, runtime, name)
    if state.status == "absent":
        return False
    if state.owner != marker:
        raise ContainerError(f"{host.description}: container {name} is not ours (label {OWNER_LABEL}={state.owner!r})")
    _run(host, [runtime, "stop", "--time", str(grace_s), name], timeout + grace_s, f"stopping container {name}")
    _run(host, [runtime, "rm", "--force", name], timeout, f"removing container {name}")
    return True


def reusable(state: ContainerState, spec: ContainerSpec) -> bool:
    """Ours, running, and created from exactly `spec` (image id, mounts, arguments)."""
    return state.running and state.owner == spec.marker and state.spec_digest == spec_digest(spec)


def up(host: HostShell, spec: ContainerSpec, timeout: float = 120, reuse: bool = True) -> ContainerState:
    """The node's container from `spec`: one of ours already running from the same spec is kept (`reuse`),
    else it is (re)created, an old one of ours removed first."""
    check_spec(spec)
    current = inspect(host, spec.runtime, spec.name)
    if reuse and reusable(current, spec):
        return replace(current, reused=True)
    down(host, spec.runtime, spec.marker)
    # podman refuses a missing bind source (docker would create it root-owned): make ours first.
    folders = [f for f in (spec.state_dir, spec.model_cache) if f]
    _run(host, ["mkdir", "-p", "-m", "700", *folders], timeout, "creating the state folder")
    if spec.model_cache:
        check_host_folders(host, spec.model_cache, "DSPARK_CONTAINER_MODEL_CACHE", timeout)
    if spec.jit_cache:
        check_private_folder(host, spec.jit_cache, "DSPARK_CONTAINER_JIT_CACHE", timeout)
    _run(host, run_argv(spec), timeout, f"starting container {spec.name} from {spec.image}")
    state = inspect(host, spec.runtime, spec.name)
    if not state.running:
        raise ContainerError(f"{host.description}: container {spec.name} is {state.status} right after its start")
    return state


# Each folder from `$1` up to /, by lstat (a link is shown as one, then what it points to): run on the
# node's host, where rsync and the runtime's bind mounts meet these folders, not inside a container.
_FOLDER_CHAIN = (
    'mkdir -p -m 700 "$1" || exit 1; id -u; p="$1"; while :; do stat -c "%u %a %F|%n" "$p"; '
    'if [ -L "$p" ]; then stat -L -c "%u %a %F|%n" "$p"; fi; [ "$p" = / ] && break; '
    'p=$(dirname "$p"); done'
)


@dataclass(frozen=True)
class FolderEntry:
    uid: int
    mode: int
    kind: str  # stat's %F: "directory", "symbolic link", ...
    path: str

    @property
    def link(self) -> bool:
        return self.kind == "symbolic link"


def folder_chain(host: HostShell, folder: str, timeout: float = 60) -> tuple[int, list[FolderEntry]]:
    """`folder` (created 0700 when missing) and each folder above it on the node's host, never followed
    unnoticed: (the uid we run as there, the entries from `folder` up)."""
    lines = _run(
        host, ["sh", "-c", _FOLDER_CHAIN, "sh", os.path.abspath(folder)], timeout, f"preparing {folder}"
    ).splitlines()
    entries = []
    for line in lines[1:]:
        head, _, path = line.partition("|")
        uid, mode, kind = head.split(" ", 2)
        entries.append(FolderEntry(int(uid), int(mode, 8), kind, path))
    return int(lines[0]), entries


def _check_above(host: HostShell, folder: str, setting: str, uid: int, entries: list[FolderEntry]) -> None:
    """Every folder above (and a link on the way, and what it points to): root's or ours, writable by
    others only with the sticky bit (like /tmp): nobody else can swap what lies below."""
    for entry in entries:
        open_to_others = not entry.link and entry.mode & 0o022 and not entry.mode & 0o1000
        if entry.uid not in (0, uid) or open_to_others:
            raise ContainerError(
                f"{host.description}: {entry.path}, above {folder} ({setting}), is owned by uid "
                f"{entry.uid} with mode {entry.mode:o}; allowed: owned by root or uid {uid}, not "
                "group- or other-writable unless sticky"
            )


def check_private_folder(host: HostShell, folder: str, setting: str, timeout: float = 60) -> None:
    """Create `folder` (mode 700) on the node's host when missing; ContainerError unless it is a real folder
    (a link is never followed) owned by the user we run as, neither group- nor other-writable, below folders
    only root or that user can change (what runs from it is compiled code)."""
    uid, entries = folder_chain(host, folder, timeout)
    leaf = entries[0]
    if leaf.link:
        raise ContainerError(
            f"{host.description}: {folder} ({setting}) is a symbolic link (never followed); "
            f"allowed: a real folder owned by uid {uid}, not group- or other-writable"
        )
    if leaf.uid != uid or leaf.mode & 0o022:
        raise ContainerError(
            f"{host.description}: {folder} ({setting}) is owned by uid {leaf.uid} with mode "
            f"{leaf.mode:o}; allowed: owned by uid {uid}, not group- or other-writable "
            f"(chmod go-w {folder})"
        )
    _check_above(host, folder, setting, uid, entries[1:])


def check_host_folders(host: HostShell, folder: str, setting: str, timeout: float = 60) -> None:
    """The container model cache and the folders above it, on the host (the bind mount hides them from the
    container's agent, and rsync writes there as root): each root's or ours and closed to other writers."""
    uid, entries = folder_chain(host, folder, timeout)
    _check_above(host, folder, setting, uid, entries)


def package_archive(package_dir: str) -> tuple[bytes, dict[str, str]]:
    """The package as a gzipped tar (no caches; a link stored as the file it names) and {path: sha256}
    of every file in it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", dereference=True) as tar:
        tar.add(
            package_dir,
            arcname="dspark_launch",
            filter=lambda info: None if "__pycache__" in info.name or info.name.endswith(".pyc") else info,
        )
    hashes: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(buffer.getvalue())) as tar:
        for member in tar.getmembers():
            if member.isfile():
                hashes[member.name] = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
    return gzip.compress(buffer.getvalue(), mtime=0), hashes


def _ship_program() -> str:
    """safe_path's source (host mode's folder rules), then agent_copy_host's: run by the host's python3."""
    from dspark_launch.node import agent_copy_host, safe_path

    return "\n".join(Path(module.__file__).read_text(encoding="utf-8") for module in (safe_path, agent_copy_host))


def ship_package(host: HostShell, package_dir: str, dest_root: str, timeout: float = 60) -> str:
    """Copy the launcher's package folder into the worker's state folder `dest_root` on its host; returns
    the copy's path (the node's `agent_package`).

    Before anything is written the state folder is checked as host mode's pre-flight does (made 0700, or
    a real folder of this user that group and others cannot write, under folders only root or this user
    can replace): a refusal is exit 1 naming it, nothing shipped or started. The copy's folder is named
    by a hash of the content, but the name is never trusted: an existing copy is used only when every
    file's sha256 matches and nothing else is there (else it is removed and shipped again), and a new
    one is unpacked beside and checked before it is renamed into place (node/agent_copy_host.py).
    """
    from dspark_launch.node import agent_copy_host

    payload, hashes = package_archive(package_dir)
    digest = hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()[:16]
    stdin = json.dumps(hashes) + "\n" + base64.b64encode(payload).decode()
    proc = host.run(["python3", "-c", _ship_program(), dest_root, digest], timeout=timeout, input=stdin)
    detail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    if proc.returncode == agent_copy_host.UNSAFE_EXIT:
        raise ContainerError(
            f"{host.description}: {detail}; refusing to ship the launcher's package there, "
            "nothing was started (remove it if nobody should have put it there)"
        )
    if proc.returncode != 0:
        raise ContainerError(
            f"{host.description}: copying the launcher's package failed (python3 on the node's host): {detail}"
        )
    return f"{proc.stdout.strip().splitlines()[-1]}/dspark_launch"


def transport(host: HostShell, spec: ContainerSpec) -> ContainerTransport:
    """The agent transport into this node's container."""
    return ContainerTransport(host=host, runtime=spec.runtime, container=spec.name, python=spec.python)
