"""What an operator may add to the node container's `run` command (DSPARK_CONTAINER_ARGS).

The launcher owns the container's identity, lifetime and namespaces: `stop` finds the
container by its name and label, removing it must end every process of ours (its own
PID namespace), Ray and vLLM need the host's network and IPC, and the launcher mounts
the agent, the state folder and the model cache itself. Arguments that would change any
of that are refused; everything else (more devices, `--privileged`, `--cap-add`, more
volumes, `--env`, `--security-opt`, ...) passes through unchanged.
"""

from __future__ import annotations

import re

from dspark_launch.config.checks import shell_words

# Each refused flag and the reason shown to the operator.
REFUSED_FLAGS = {
    "--network": "the launcher runs the container on the host's network",
    "--net": "the launcher runs the container on the host's network",
    "--ipc": "the launcher shares the host's IPC namespace",
    "--pid": "stop relies on the container's own PID namespace",
    "--name": "the launcher names the container from the deployment's marker",
    "--label": "the launcher labels its container (stop finds exactly ours)",
    "-l": "the launcher labels its container (stop finds exactly ours)",
    "--rm": "the launcher removes its container itself",
    "--detach": "the launcher detaches the container itself",
    "-d": "the launcher detaches the container itself",
    "--entrypoint": "the container's main process is the launcher's (an idle init)",
    "--restart": "the launcher restarts the container itself",
    "--pod": "one container per node, outside any pod",
    "--userns": "the launcher's mounts and Ray need the host's user ids",
    "--uts": "each node keeps its own hostname",
    "--shm-size": "with the host's IPC namespace the host's /dev/shm is used (podman refuses a size)",
}
_FLAG = re.compile(r"^(--?[A-Za-z][A-Za-z0-9-]*)(=.*)?$")


def refused_flag(words: list[str]) -> tuple[str, str] | None:
    """The first refused flag among `words`, with its reason; None when all may pass."""
    for word in words:
        match = _FLAG.match(word)
        if match and match.group(1) in REFUSED_FLAGS:
            return match.group(1), REFUSED_FLAGS[match.group(1)]
    return None


def check_container_args(value: str) -> str:
    """TextSetting check: shell words, none of them a flag the launcher owns."""
    refused = refused_flag(shell_words(value))
    if refused:
        raise ValueError(f"container arguments other than {refused[0]} ({refused[1]})")
    return value


_IMAGE_REFERENCE = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


def check_image(value: str) -> str:
    """TextSetting check: an image reference (registry/name:tag or name@sha256:digest), or empty."""
    if value and not _IMAGE_REFERENCE.match(value):
        raise ValueError("an image reference such as nvcr.io/nvidia/vllm:25.11-py3 or name@sha256:<64 hex>")
    return value


_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def unpinned_image_warning(runtime: str, image: str, source: str) -> str | None:
    """A line for `plan` and `status` when the container image is named by a tag: whoever can push that
    tag (or the registry) chooses what runs as root on every node at the next start."""
    if runtime not in ("docker", "podman") or not image or _DIGEST.search(image):
        return None
    return (
        f"DSPARK_IMAGE={image} ({source}) is a tag, not a digest: whoever can move that tag chooses what "
        "runs on every node at the next start; pin it as NAME@sha256:DIGEST "
        "(e.g. `podman image inspect --format '{{.Digest}}' IMAGE`)"
    )
