"""The values the node's libraries return and the agent's protocol carries as they are: the model's manifest and
its checks (`model_files`), the fabric environment (`fabric`), the installed vLLM's offer and dry boot
(`vllm_offer`, `vllm_dryboot`), a node's version row (`versions`).

Stdlib only; frozen dataclasses, each field a JSON value (agent/codec.py encodes them for the wire)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from dspark_launch.node.model_paths import require_relative  # checks a manifest's names as it is built

# --- model weights: the manifest (written beside the weights as .dspark-manifest.json) -----------------

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to the model folder, "/"-separated
    size: int
    sha256: str  # "" while unknown (a hub listing before the download): size-only checks
    # The head's stat when it hashed the file (0: unknown): an unchanged file is not hashed again.
    # Not part of the stamp (they differ between nodes).
    mtime_ns: int = 0
    inode: int = 0

    def __post_init__(self) -> None:
        require_relative(self.path, "manifest")  # whoever built it: a listing, a file, a verify request
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"manifest: {self.path!r} has size {self.size!r}; allowed: a whole number >= 0")


@dataclass(frozen=True)
class Manifest:
    source: str  # hub repo id, or the local folder it was built from
    revision: str  # hub commit, or "local"
    files: tuple[ManifestFile, ...]

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def stamp(self) -> str:
        """Identifies this exact content: equal stamps mean equal paths, sizes and hashes."""
        import hashlib  # here: every node-agent process imports these values, few compute a digest

        canonical = json.dumps(
            [self.source, self.revision, [[f.path, f.size, f.sha256] for f in self.files]], separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "source": self.source,
                "revision": self.revision,
                "stamp": self.stamp,
                "files": [
                    {"path": f.path, "size": f.size, "sha256": f.sha256, "mtime_ns": f.mtime_ns, "inode": f.inode}
                    for f in self.files
                ],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a manifest of format {MANIFEST_FORMAT}")
        manifest = cls(
            str(data["source"]),
            str(data["revision"]),
            tuple(
                ManifestFile(
                    str(f["path"]), int(f["size"]), str(f["sha256"]), int(f.get("mtime_ns", 0)), int(f.get("inode", 0))
                )
                for f in data["files"]
            ),
        )
        if data.get("stamp") != manifest.stamp:
            raise ValueError("manifest stamp does not match its content")
        return manifest


MISSING, PARTIAL, OVERSIZED, CORRUPT, STALE = "missing", "partial", "oversized", "corrupt", "stale"
SPECIAL = "special"  # not a regular file (a FIFO, a device): never read


@dataclass(frozen=True)
class FileProblem:
    path: str
    kind: str  # missing | partial (too short) | oversized | corrupt (sha256 differs) | stale (manifest) | special
    expected_size: int
    actual_size: int  # -1 when missing

    def describe(self) -> str:
        if self.kind == MISSING:
            return f"{self.path}: missing"
        if self.kind in (PARTIAL, OVERSIZED):
            return f"{self.path}: {self.kind} ({self.actual_size} of {self.expected_size} bytes)"
        if self.kind == SPECIAL:
            return f"{self.path}: not a regular file (never read)"
        if self.kind == STALE:
            return f"{self.path}: no manifest of this model (never verified here, or another revision)"
        return f"{self.path}: corrupt (sha256 differs)"


@dataclass(frozen=True)
class VerifyReport:
    folder: str
    full: bool  # True: sizes and sha256; False: sizes only (plus the stamp for a fast check)
    files_checked: int
    bytes_checked: int  # bytes hashed (0 for size-only checks)
    problems: tuple[FileProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_paths(self) -> tuple[str, ...]:
        return tuple(p.path for p in self.problems if p.kind != STALE)


@dataclass(frozen=True)
class DiskSpace:
    path: str  # the path asked about
    checked: str  # the nearest existing folder, whose filesystem was measured
    free_bytes: int


@dataclass(frozen=True)
class NodePlacement:
    """What a copy needs to know of one node, from one agent call: the sizes of the model's files there,
    the free space where they go, and the stamp of the manifest this node last verified."""

    sizes: VerifyReport  # size-only check of every file of the manifest asked about
    space: DiskSpace
    verified_stamp: str  # the stamp of the node's own manifest; "" when it has none (never verified here)


# --- the fabric and the installed vLLM, as the nodes report them -------------------------------------


@dataclass(frozen=True)
class FabricRequest:
    """What one node needs to work out its fabric environment (built by the launcher, sent to the node's agent)."""

    node: str  # "head", "worker1": for messages
    ifname: str  # the fabric interface on this node
    fabric_ip: str  # the node's fabric IP (Ray's --node-ip-address)
    hca_list: str = ""  # NCCL_IB_HCA as the operator gave it (for this node), NCCL's form; "" = found in sysfs
    gid_index: str = ""  # NCCL_IB_GID_INDEX given by the operator (for this node); "" = found in sysfs
    socket_ifnames: tuple[tuple[str, str], ...] = ()  # NCCL_/GLOO_/TP_SOCKET_IFNAME the operator set


@dataclass(frozen=True)
class FabricEnv:
    """One node's fabric environment, and how each value was found."""

    node: str
    env: tuple[tuple[str, str], ...]
    hcas: tuple[str, ...]
    gid_index: str
    roce: bool  # False: NCCL falls back to TCP sockets
    notes: tuple[str, ...]
    warnings: tuple[str, ...]
    missing: str = ""  # when not `roce`: what is missing, one line naming the interface (start refuses on it)


@dataclass(frozen=True)
class OfferedFlag:
    option_strings: tuple[str, ...]  # every spelling: "--tensor-parallel-size", "-tp"
    dest: str  # argparse destination, one per flag: "tensor_parallel_size"
    takes_value: bool  # False for switches ("--async-scheduling" / "--no-async-scheduling")
    choices: tuple[str, ...] = ()  # the values this build accepts; () when any value goes

    def negative(self) -> str | None:
        """The spelling that turns a switch off as the build lists it: "--no-enable-prefix-caching" up to 0.32,
        "--disable-prefix-caching" from 0.33 ("--enable-cascade-attn" for "--disable-cascade-attn"; 0.33 still
        parses the --no- forms, unlisted); None when the switch has none."""
        stem = self.option_strings[0][2:] if self.option_strings and self.option_strings[0].startswith("--") else ""
        forms = [f"--no-{stem}"]
        for on, off in (("enable-", "disable-"), ("disable-", "enable-")):
            if stem.startswith(on):
                forms.append(f"--{off}{stem[len(on) :]}")
        return next((form for form in forms if stem and form in self.option_strings), None)


@dataclass(frozen=True)
class KvVerdict:
    """How one `--kv-cache-dtype` value fares on one GPU generation."""

    dtype: str
    layout: str  # what the attention stores it as ("fp8" -> "fp8_ds_mla"); "" when refused
    refusal: str = ""  # vLLM's own words when refused; "" when accepted


@dataclass(frozen=True)
class KvJudgement:
    """The installed vLLM's DeepSeek-V4 attention on one compute capability, every dtype judged."""

    capability: str  # "12.1"
    attention: str  # the layer class vLLM selects there and its backend
    verdicts: tuple[KvVerdict, ...]

    def verdict(self, dtype: str) -> KvVerdict | None:
        return next((v for v in self.verdicts if v.dtype == dtype), None)


@dataclass(frozen=True)
class BackendVerdict:
    """How one kernel-backend flag value (`--moe-backend b12x`) fares in the dry boot on one capability."""

    value: str
    chosen: str = ""  # what vLLM's selection lands on ("B12X_MXFP4_MXFP8", "MARLIN"); "" when refused
    refusal: str = ""  # vLLM's own words when refused
    deep_gemm: str = ""  # VLLM_USE_DEEP_GEMM as judged: "" unset (vLLM's default, on), "0" off


@dataclass(frozen=True)
class GraphVerdict:
    """The CUDA-graph mode vLLM really runs for a requested `cudagraph_mode` and VLLM_USE_BREAKABLE_CUDAGRAPH."""

    requested: str  # "FULL_AND_PIECEWISE"
    breakable: str  # the variable's value: "" unset, "0", "1"
    effective: str  # the mode after vLLM's resolution; "" when vLLM refuses the combination
    why: str


@dataclass(frozen=True)
class BootJudgement:
    """The dry boot on one compute capability: vLLM's own pre-GPU decisions for the checkpoint (vllm_dryboot)."""

    capability: str
    attention: str  # the DeepSeek-V4 attention layer vLLM builds there and its backend
    moe_method: str  # the quantization method the checkpoint's routed experts get ("Mxfp4MoEMethod")
    moe: tuple[BackendVerdict, ...]  # every --moe-backend value
    linear: tuple[BackendVerdict, ...]  # every --linear-backend value
    graphs: tuple[GraphVerdict, ...]
    # Decisions vLLM's code could not be asked for here ("moe", "linear", "graphs", "attention") and why: never
    # a verdict, so a plan that needs one refuses (config/profile_resolve.py), naming the decision.
    unjudged: tuple[tuple[str, str], ...] = ()

    def verdict(self, kind: str, value: str, deep_gemm: str = "") -> BackendVerdict | None:
        return next((v for v in getattr(self, kind) if v.value == value and v.deep_gemm == deep_gemm), None)

    def unjudged_why(self, kind: str) -> str:
        """Why decision `kind` could not be judged here; "" when it was."""
        return next((why for name, why in self.unjudged if name == kind), "")

    def graph(self, requested: str, breakable: str) -> GraphVerdict | None:
        return next((g for g in self.graphs if g.requested == requested and g.breakable == breakable), None)


@dataclass(frozen=True, kw_only=True)
class VllmOffer:
    version: str
    flags: tuple[OfferedFlag, ...]
    speculative_methods: tuple[str, ...]  # values of "method" in --speculative-config
    source: str = "the installed vLLM's serve parser"
    kv_judgements: tuple[KvJudgement, ...] = ()  # per JUDGED_CAPABILITIES; () when not judged
    kv_judged_by: str = ""  # what judged them, or why they are not ("" in a recorded description)
    env_names: tuple[str, ...] | None = None  # the variables vllm.envs reads; None: not known
    modules: tuple[str, ...] | None = None  # which OPTIONAL_MODULES are installed; None: not known
    draft_sample_methods: tuple[str, ...] = ()  # values of "draft_sample_method" in --speculative-config
    speculative_fields: tuple[str, ...] = ()  # the keys --speculative-config takes; () not known
    boot_judgements: tuple[BootJudgement, ...] = ()  # the dry boot per JUDGED_CAPABILITIES; () when not run
    booted_by: str = ""  # what ran the dry boot (and on which config.json), or why it did not run

    def boot(self, capability: str) -> BootJudgement | None:
        return next((j for j in self.boot_judgements if j.capability == capability), None)

    def judgement(self, capability: str) -> KvJudgement | None:
        return next((j for j in self.kv_judgements if j.capability == capability), None)

    def flag(self, option: str) -> OfferedFlag | None:
        """The flag `option` names ("--kv-cache-dtype", "--no-async-scheduling", "-tp"), if offered."""
        for flag in self.flags:
            if option in flag.option_strings:
                return flag
        return None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> VllmOffer:
        data = json.loads(text)
        flags = tuple(
            OfferedFlag(tuple(f["option_strings"]), f["dest"], bool(f["takes_value"]), tuple(f["choices"]))
            for f in data["flags"]
        )
        judgements = tuple(
            KvJudgement(
                j["capability"],
                j["attention"],
                tuple(KvVerdict(v["dtype"], v["layout"], v.get("refusal", "")) for v in j["verdicts"]),
            )
            for j in data.get("kv_judgements", ())
        )
        optional = {name: (None if data.get(name) is None else tuple(data[name])) for name in ("env_names", "modules")}

        def backends(found: list[dict[str, str]]) -> tuple[BackendVerdict, ...]:
            return tuple(
                BackendVerdict(v["value"], v.get("chosen", ""), v.get("refusal", ""), v.get("deep_gemm", ""))
                for v in found
            )

        boots = tuple(
            BootJudgement(
                b["capability"],
                b["attention"],
                b["moe_method"],
                backends(b["moe"]),
                backends(b["linear"]),
                tuple(GraphVerdict(g["requested"], g["breakable"], g["effective"], g["why"]) for g in b["graphs"]),
                tuple((str(name), str(why)) for name, why in b.get("unjudged", ())),
            )
            for b in data.get("boot_judgements", ())
        )
        return cls(
            version=str(data["version"]),
            flags=flags,
            speculative_methods=tuple(data["speculative_methods"]),
            source=data.get("source", "a recorded description"),
            kv_judgements=judgements,
            kv_judged_by=data.get("kv_judged_by", ""),
            env_names=optional["env_names"],
            modules=optional["modules"],
            draft_sample_methods=tuple(data.get("draft_sample_methods", ())),
            speculative_fields=tuple(data.get("speculative_fields", ())),
            boot_judgements=boots,
            booted_by=data.get("booted_by", ""),
        )


# --- a node's versions ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class VersionRow:
    """One node's row of the version matrix; every field must be equal on all nodes."""

    python: str | None = None
    vllm: str | None = None
    ray: str | None = None
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    compute_capability: str | None = None  # the GPU's, "12.1" on a GB10 (nvidia-smi); None without a GPU
    nccl: str | None = None  # the NCCL vLLM loads there (VLLM_NCCL_SO_PATH, torch's nvidia-nccl wheel, the system's)
    packages: str | None = None  # the optional kernel packages and their versions (node/versions.package_row)
    nvcc: str | None = None  # the CUDA compiler DeepGEMM's JIT runs (DeepSeek-V4's fp8_einsum): "12.9"; None: not found
    memlock: str | None = None  # RLIMIT_MEMLOCK soft limit of the agent ("unlimited" or bytes); shown, not compared
    dspark_launch: str | None = None
    scheduler_sha256: str | None = None
    hostname: str | None = None  # shown, not compared
    image: str | None = None  # the node container's image id (DSPARK_RUNTIME=docker|podman); None on a host


@dataclass(frozen=True)
class FabricPortFacts:
    """One RDMA device port as its sysfs shows it (node/platform.py): the ConnectX firmware, the port's state,
    and its network interface's MTU and link speed."""

    hca: str
    port: str
    firmware: str  # fw_ver ("28.45.1020"); "" unreadable
    state: str  # "4: ACTIVE"
    netdev: str = ""  # the device's network interface ("" when sysfs names none)
    mtu: int | None = None
    speed_mbps: int | None = None  # the interface's link speed (None: down or unreadable)


@dataclass(frozen=True)
class PlatformFacts:
    """What a node's kernel, driver and fabric are, read from its procfs and sysfs (node/platform.py): the facts
    the platform pre-flight judges and compares across nodes, and `status` compares with those at start."""

    kernel: str  # /proc/sys/kernel/osrelease ("" unreadable)
    cma_total_kb: int | None  # CmaTotal of /proc/meminfo (None: the kernel shows none)
    nvidia_driver: str | None  # /proc/driver/nvidia/version, else /sys/module/nvidia/version (None: no driver loaded)
    nvidia_loaded: bool  # the nvidia kernel module is loaded (/sys/module/nvidia)
    nvidia_module_kernels: tuple[str, ...]  # the kernel releases under /lib/modules that hold an nvidia module
    ports: tuple[FabricPortFacts, ...]
    memlock: str  # RLIMIT_MEMLOCK of the node's agent ("unlimited" or bytes)
