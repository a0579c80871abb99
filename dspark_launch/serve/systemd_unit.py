"""The systemd unit for the head node: `dspark start --foreground` supervised, `dspark stop` to stop.

Every path is quoted for systemd (a folder with spaces, `%` or `$` stays one literal
argument). Exit codes the unit relies on: 0 = the operator's own `stop`/`restart` took
the run over (not restarted: `Restart=on-failure`), 3 = already running and healthy,
143 = stopped by SIGTERM (both success); 1 = the server or a node's Ray was lost (restarted).
TimeoutStopSec covers `dspark stop`'s drain (DSPARK_DRAIN_TIMEOUT_S) on top of its own bounded waits.
"""

from __future__ import annotations

from pathlib import Path


def _specifiers(text: str) -> str:
    return text.replace("%", "%%")


def quote_arg(arg: str, expands_variables: bool = True) -> str:
    """One ExecStart= argument as systemd reads it back: quoted and escaped, `%` and `$` literal
    (systemd expands `$NAME` in the arguments, not in the program's path)."""
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"')
    if expands_variables:
        escaped = escaped.replace("$", "$$")
    return _specifiers(f'"{escaped}"')


def command_line(argv: list[str]) -> str:
    return " ".join(quote_arg(arg, expands_variables=index > 0) for index, arg in enumerate(argv))


# `dspark stop` without a drain: the server, then Ray on every node (SIGKILL after bounded waits).
STOP_WITHOUT_DRAIN_S = 120


def unit_text(launcher: list[str], env_file: Path, user: str, drain_s: int = 0) -> str:
    """`drain_s`: DSPARK_DRAIN_TIMEOUT_S, which `dspark stop` (ExecStop) may spend letting requests finish."""
    env = str(env_file)
    start = command_line([*launcher, "start", "--foreground", "--env-file", env])
    stop = command_line([*launcher, "stop", "--env-file", env])
    return f"""[Unit]
Description=DeepSeek-V4-Flash on DGX Spark (dspark-launch: Ray across the nodes + vLLM)
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User={user}
WorkingDirectory={_specifiers(str(env_file.parent))}
ExecStart={start}
ExecStop={stop}
# 3 = already running and healthy (e.g. started by hand before the unit); 143 = stopped by SIGTERM.
# 0 = an operator's `dspark stop` or `dspark restart` took the run over: not restarted.
SuccessExitStatus=3 143
Restart=on-failure
RestartSec=30
TimeoutStartSec=infinity
TimeoutStopSec={STOP_WITHOUT_DRAIN_S + drain_s}
KillMode=mixed

[Install]
WantedBy=multi-user.target"""
