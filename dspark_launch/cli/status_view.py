"""`dspark status` as text: on a terminal a Rich table sized to it with coloured state words, plain text otherwise.

Everything a node or a log sent goes through `printable` before it becomes a Rich `Text` (never markup).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from dspark_launch.cli.output import printable, say, table

STATE_STYLE = {
    "up": "bold green",
    "alive": "green",
    "yes": "green",
    "applied": "green",
    "starting": "bold yellow",
    "down": "yellow",
    "unhealthy": "bold red",
    "dead": "bold red",
    "degraded": "bold red",
    "NO": "bold red",
    "off": "bold yellow",
    "stalled": "bold red",
    "closed": "bold yellow",
}
NODE_COLUMNS = ("NODE", "IP", "REACHABLE", "RAY", "REGISTERED", "GPUS", "VLLM", "RAY VER", "HOTFIX")


def human_duration(seconds: float) -> str:
    """3 s, 4 min 10 s, 2 h 5 min, 3 d 4 h: two units at most."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def state_word(word: str) -> Text:
    return Text(printable(word), style=STATE_STYLE.get(word, ""))


def line(*parts: str | Text) -> Text:
    """One output line from plain strings (made printable) and styled words."""
    return Text.assemble(*(part if isinstance(part, Text) else printable(part) for part in parts))


def _node_rows(view) -> list[tuple[str, ...]]:
    rows = []
    for n in view.nodes:
        versions = n.versions
        rows.append(
            (
                n.name,
                n.ip,
                "yes" if n.reachable else "NO",
                "alive" if n.ray_alive else "down",
                n.registered_ip or "-",
                "-" if n.gpus is None else f"{n.gpus:g}",
                (versions and versions.vllm) or "-",
                (versions and versions.ray) or "-",
                n.hotfix or "-",
            )
        )
    return rows


def _table(
    headers: Iterable[str], rows: list[tuple[str, ...]], rich: bool, styled: tuple[int, ...] = ()
) -> RenderableType:
    headers = tuple(headers)
    if not rich:
        return table(headers, [tuple(printable(c) for c in row) for row in rows], indent="  ")
    grid = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold", show_edge=False)
    for header in headers:
        grid.add_column(header, overflow="fold")
    for row in rows:
        grid.add_row(*(state_word(cell) if i in styled else Text(printable(cell)) for i, cell in enumerate(row)))
    return grid


def _unreachable_lines(view) -> list[Text]:
    """Each node's NO with its reason, unless a problem line already names it."""
    return [
        line(f"  {n.name}: unreachable: {n.unreachable_reason or 'no answer'}")
        for n in view.nodes
        if not n.reachable and not any(p.startswith(n.label) for p in view.problems)
    ]


def status_renderables(view, env_file: str, rich: bool, now: float | None = None) -> list[RenderableType]:
    """What `dspark status` prints, in order (`rich`: a terminal that shows colour and Rich tables)."""
    from dspark_launch.serve.restart_kind import LIVE_LEVEL

    now = time.time() if now is None else now
    out: list[RenderableType] = []
    if not view.deployed:
        out.append(line("nothing deployed (env file ", env_file, "): `dspark start` brings it up"))
        for n in view.nodes:
            out.append(
                line(
                    f"  {n.label}: ",
                    *(
                        ("reachable",)
                        if n.reachable
                        else (state_word("NO"), f": {n.unreachable_reason or 'no answer'}")
                    ),
                )
            )
    else:
        since = f", up {human_duration(now - view.started_at)}" if view.started_at and view.state != "down" else ""
        out.append(line("cluster: ", state_word(view.state), f" (Ray {view.ray_address}{since})"))
        out.append(_table(NODE_COLUMNS, _node_rows(view), rich, styled=(2, 3, 8)))
        out += _unreachable_lines(view)
        boxes = [(n.name, n.container, n.container_status, n.image_id or "-") for n in view.nodes if n.container]
        if boxes:
            out.append(_table(("NODE", "CONTAINER", "STATE", "IMAGE"), boxes, rich, styled=()))
        out += _server_lines(view.server, LIVE_LEVEL, now)
        if view.memory is not None:
            memory = view.memory
            out.append(
                line(
                    f"memory (the supervisor's, {human_duration(now - memory.at)} ago): "
                    + "; ".join(f"{label} {node.line}" for label, node in memory.nodes.items())
                )
            )
            guard = memory.guard
            if guard.mode == "pause":
                since = f" since {time.strftime('%H:%M:%S', time.localtime(guard.since))}" if guard.since else ""
                out.append(
                    line(
                        "  memory guard (DSPARK_MEMORY_GUARD=pause): admission ",
                        state_word("closed") if guard.closed else "open",
                        since,
                        f": {guard.reason}" if guard.reason else "",
                    )
                )
        if view.recoveries:
            last = view.recoveries[-1]
            out.append(
                line(
                    f"supervisor: {len(view.recoveries)} recovery(ies) within the last hour; the last "
                    f"{human_duration(now - last.at)} ago, {last.kind}: {last.cause}"
                )
            )
    out += [line(f"warning: {w}") for w in (*view.fabric_warnings, *view.warnings)]
    out += [line(f"problem: {p}") for p in view.problems]
    return out


def _server_lines(s, live_level, now: float) -> list[Text]:
    if s.state == "down" and not s.pid:
        return [line("server: not started")]
    uptime = f", up {human_duration(s.uptime_s)}" if s.uptime_s is not None else ""
    cap = s.cap if s.cap is not None else "none (hotfix off)"
    out = [
        line(
            "server: ",
            state_word(s.state),
            f" (pid {s.pid}{uptime}) {s.url}  cap {cap}  KV cache {s.kv_cache_tokens} tokens",
        )
    ]
    m = s.metrics
    if m.reported:
        out.append(
            line(
                f"  running {m.running or 0:g}  waiting {m.waiting or 0:g}  "
                f"KV cache used {100 * (m.kv_cache_usage or 0):.1f}%"
            )
        )
    if s.engine is not None:
        said = s.engine.line
        out.append(
            line("  engine: ", state_word("stalled"), said[len("engine: stalled") :])
            if s.engine.stalled
            else line(f"  {said}")
        )
    if s.live:
        since = (
            (
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s.live_since))}, "
                f"{human_duration(now - s.live_since)} ago"
            )
            if s.live_since
            else "?"
        )
        out.append(
            line(
                f"  live (dspark reload, since {since}): "
                + ", ".join(f"{name}={value}" for name, value in sorted(s.live.items()))
            )
        )
    for d in s.drift:
        out.append(
            line(
                f"  drift: {d.name} {d.running} -> {d.configured}: "
                + ("`dspark reload` applies it" if d.name in live_level else "restart to apply")
            )
        )
    if s.profile:
        out.append(line(f"  profile {s.profile}:"))
    out += [line(f"    {decision}") for decision in s.decisions]
    return out


def print_status(view, env_file: str, console: Console | None = None, plain: Callable[[str], None] = say) -> None:
    """On a terminal through Rich (colour, tables sized to it); else each line as plain text."""
    console = console or Console(highlight=False)
    rich = console.is_terminal
    for item in status_renderables(view, env_file, rich):
        if rich:
            console.print(item, soft_wrap=False)
        else:
            plain(item.plain if isinstance(item, Text) else str(item))
