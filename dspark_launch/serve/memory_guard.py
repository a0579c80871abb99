"""Memory on every node, sampled by the supervisor, and the guard that pauses admission under memory pressure.

Every MEMORY_CHECK_S the supervisor asks every node's agent for MemTotal, MemAvailable and the kernel's memory
pressure (PSI `some avg10`, /proc/pressure/memory, where the kernel has it) and keeps the last sample in
`STATE/memory-watch.json`, which `dspark status` shows.

With `DSPARK_MEMORY_GUARD=pause` (off by default) the supervisor closes admission when any node's MemAvailable
falls below `DSPARK_MEMORY_FLOOR_MIB`, or its pressure reaches `DSPARK_MEMORY_PRESSURE_PCT`:
the patched scheduler's live setting DSPARK_ADMISSION_CLOSED (hotfix/contract.py) put in force the way `dspark
reload` does (the head's scheduler control file, the values in force plus that one; the scheduler's own `(live)`
line says when): running streams go on decoding, no new prompt is admitted, prompts wait in vLLM's queue. It opens
again once every node is back above 1.5 x the floor and below half the pressure (a hysteresis: one prompt's
prefill must not flap it), and when supervision ends. Every change is a line in the journal and the server log.

What it cannot prevent: a prompt already admitted whose own prefill exhausts memory (a 256K cold prompt on a node
that has too little left), memory that another process takes, and a sample that comes too late (every
MEMORY_CHECK_S): it stops more work from arriving, never the work in flight.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from dspark_launch.agent import protocol as p
from dspark_launch.cluster import lifecycle, platform_check
from dspark_launch.cluster.parallel import on_each
from dspark_launch.cluster.spec import ClusterSpec
from dspark_launch.cluster.state import LockHeld, ServerRecord
from dspark_launch.config.settings import Settings
from dspark_launch.errors import DsparkError
from dspark_launch.hotfix import contract
from dspark_launch.node.safe_path import read_private, write_private

WATCH_FILE = "memory-watch.json"
MEMORY_CHECK_S = 5.0
REOPEN_FACTOR = 1.5  # reopen once MemAvailable is back above this many times the floor
CONFIRM_S = 3.0  # how long the guard waits for the scheduler's own line after a change


@dataclass(frozen=True)
class NodeMemory:
    total_bytes: int | None
    available_bytes: int | None
    pressure_some: float | None  # PSI memory some avg10, %; None: no PSI on that kernel
    pressure_full: float | None

    @property
    def line(self) -> str:
        gib = 1 << 30
        shown = (
            f"{self.available_bytes / gib:.1f} of {self.total_bytes / gib:.1f} GiB available"
            if self.available_bytes is not None and self.total_bytes
            else "MemAvailable unknown"
        )
        pressure = (
            f", pressure some {self.pressure_some:.1f}% full {self.pressure_full or 0:.1f}%"
            if self.pressure_some is not None
            else ", no PSI"
        )
        return shown + pressure


@dataclass(frozen=True)
class GuardState:
    """The memory guard's admission switch: closed by it (since when, why); `mode` DSPARK_MEMORY_GUARD."""

    mode: str = "off"
    closed: bool = False
    since: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class MemoryWatch:
    """What the supervisor saw last (`status --json`: `memory`)."""

    marker: str  # the server it watched
    at: float
    nodes: dict[str, NodeMemory] = field(default_factory=dict)  # by node label
    guard: GuardState = field(default_factory=GuardState)
    pid: int = 0  # the supervisor's


def sample(spec: ClusterSpec) -> dict[str, NodeMemory]:
    """Every node's memory by label, asked at once; a node that does not answer is left out (the Ray checks name it)."""
    query = platform_check.memory_query(spec)

    def ask(node) -> NodeMemory | None:
        try:
            answer: p.MemoryAnswer = node.agent().call(query, "memory watch")
        except DsparkError:
            return None
        return NodeMemory(answer.total_bytes, answer.available_bytes, answer.pressure_some, answer.pressure_full)

    found = on_each(spec.nodes, ask)
    return {spec.node(name).label: memory for name, memory in found.items() if memory is not None}


def judge(nodes: dict[str, NodeMemory], closed: bool, floor_mib: int, pressure_pct: float) -> tuple[bool, str]:
    """(admission closed after this look, why). Closes when a node is below the floor or at the pressure; a closed
    one opens only once every node is above REOPEN_FACTOR x the floor and below half the pressure."""
    floor = floor_mib << 20
    if not closed:
        low = [
            f"{label}: MemAvailable {m.available_bytes >> 20} MiB below DSPARK_MEMORY_FLOOR_MIB {floor_mib}"
            for label, m in nodes.items()
            if m.available_bytes is not None and m.available_bytes < floor
        ]
        low += [
            f"{label}: memory pressure {m.pressure_some:.1f}% (PSI some avg10) at or above "
            f"DSPARK_MEMORY_PRESSURE_PCT {pressure_pct:g}"
            for label, m in nodes.items()
            if m.pressure_some is not None and m.pressure_some >= pressure_pct
        ]
        return bool(low), "; ".join(low)
    still = [
        f"{label}: MemAvailable {m.available_bytes >> 20} MiB not yet above {int(floor_mib * REOPEN_FACTOR)}"
        for label, m in nodes.items()
        if m.available_bytes is not None and m.available_bytes < floor * REOPEN_FACTOR
    ]
    still += [
        f"{label}: memory pressure {m.pressure_some:.1f}% not yet below {pressure_pct / 2:g}"
        for label, m in nodes.items()
        if m.pressure_some is not None and m.pressure_some >= pressure_pct / 2
    ]
    if still:
        return True, "; ".join(still)
    return False, (
        f"every node above {int(floor_mib * REOPEN_FACTOR)} MiB available and below {pressure_pct / 2:g}% pressure"
    )


def load(state_dir: Path) -> MemoryWatch | None:
    """The supervisor's last sample; None when there is none or it is not one."""
    try:
        data = json.loads(read_private(state_dir / WATCH_FILE, limit=1 << 20))
        return MemoryWatch(
            str(data["marker"]),
            float(data["at"]),
            {label: NodeMemory(**node) for label, node in data["nodes"].items()},
            GuardState(**data["guard"]),
            int(data.get("pid", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(state_dir: Path, watch: MemoryWatch) -> None:
    try:
        write_private(state_dir / WATCH_FILE, json.dumps(asdict(watch)) + "\n")
    except OSError:
        pass


def held_values(state_dir: Path, marker: str) -> dict[str, str]:
    """The live value the guard holds on the server `marker` (admission closed), for `reload` to keep; {} when none."""
    watch = load(state_dir)
    if watch is not None and watch.marker == marker and watch.guard.closed:
        return {contract.ENV_ADMISSION: "1"}
    return {}


def control_values(server: ServerRecord, closed: bool) -> dict[str, str]:
    """The live values in force (start values, then `reload`'s), with admission closed when `closed` (an operator's
    own DSPARK_ADMISSION_CLOSED=1 stays)."""
    values = {name: value for name, value in server.running_settings.items() if name in contract.LIVE_NAMES}
    if closed:
        values[contract.ENV_ADMISSION] = "1"
    return values


def put_in_force(spec: ClusterSpec, server: ServerRecord, closed: bool) -> str:
    """The control file with admission closed (or as the values in force say), under the state lock, then up to
    CONFIRM_S for the scheduler's own `(live)` line; what happened, in words. LockHeld: an operator's command holds
    the lock (the caller tries again at its next look)."""
    from dspark_launch.node.engine_log import engine_lines
    from dspark_launch.serve.logfollow import END, LogReader

    with lifecycle.locked_deployment(spec.state_dir) as state:
        if state is None or state.server is None or state.server.marker != server.marker:
            return "the record no longer holds this server: nothing written"
        current = state.server
        if not current.control_file:
            return "the server was started without a scheduler control file: nothing written"
        values = control_values(current, closed)
        head = spec.head.agent()
        log = LogReader(head, current.log)
        log.offset = head.call(p.ReadLog(current.log, END)).offset
        head.call(p.SchedulerControl(current.control_file, contract.control_text(values)))
    wanted = "on" if values.get(contract.ENV_ADMISSION, "0") == "1" else "off"
    began, text = time.monotonic(), ""
    while time.monotonic() - began < CONFIRM_S:
        text += log.new_text()
        for said in engine_lines(text[: text.rfind("\n") + 1], "scheduler.py"):
            for line in contract.parse_live_lines(said.message):
                if (
                    contract.shown(
                        contract.LIVE[contract.ENV_ADMISSION], line.values[contract.LIVE[contract.ENV_ADMISSION].key]
                    )
                    == wanted
                ):
                    return f"in force (the scheduler: {line.changes})"
        time.sleep(0.2)
    return "written; the scheduler takes it at its next step (it logs the change then)"


class Guard:
    """The supervisor's memory watch and guard for one run: `look()` at most every MEMORY_CHECK_S; `release()` opens
    what it closed (when supervision ends, or before a recovery replaces the server)."""

    def __init__(
        self,
        settings: Settings,
        spec: ClusterSpec,
        tell: Callable[[str], None],
        note: Callable[[ServerRecord | None, str], None],
        clock: Callable[[], float] = time.time,
    ):
        import os

        self.settings, self.spec, self.tell, self.note, self.clock = settings, spec, tell, note, clock
        self.mode = settings.dspark_memory_guard
        self.state = GuardState(self.mode)
        self.last = 0.0
        self.pid = os.getpid()

    def look(self, server: ServerRecord) -> None:
        now = self.clock()
        if now - self.last < MEMORY_CHECK_S:
            return
        self.last = now
        nodes = sample(self.spec)
        if self.mode == "pause" and nodes:
            closed, why = judge(
                nodes,
                self.state.closed,
                self.settings.dspark_memory_floor_mib,
                self.settings.dspark_memory_pressure_pct,
            )
            if closed != self.state.closed:
                self._switch(server, closed, why)
        save(self.spec.state_dir, MemoryWatch(server.marker, now, nodes, self.state, self.pid))

    def _switch(self, server: ServerRecord, closed: bool, why: str) -> None:
        try:
            how = put_in_force(self.spec, server, closed)
        except (LockHeld, DsparkError) as error:
            self.tell(
                f"memory guard: could not {'close' if closed else 'open'} admission now ({error}); "
                "trying again at the next look"
            )
            return
        self.state = GuardState(self.mode, closed, self.clock(), why)
        line = f"memory guard: admission {'closed' if closed else 'open again'}: {why}: {how}"
        self.tell(line)
        self.note(server, line)

    def forget(self) -> None:
        """The server it closed admission on is being replaced: the next one starts open (launch removes the file)."""
        if self.state.closed:
            self.state = GuardState(self.mode, False, self.clock(), "the server was replaced")

    def release(self, server: ServerRecord | None) -> None:
        """Admission open again if this guard closed it (the record still holding `server`)."""
        if not self.state.closed or server is None:
            return
        try:
            how = put_in_force(self.spec, server, False)
        except (LockHeld, DsparkError) as error:
            how = f"could not write the control file ({error}); a restart opens it"
        self.state = GuardState(self.mode, False, self.clock(), "supervision ended")
        line = f"memory guard: admission open again: supervision ended: {how}"
        self.tell(line)
        self.note(server, line)
        save(self.spec.state_dir, MemoryWatch(server.marker, self.clock(), {}, self.state, self.pid))
