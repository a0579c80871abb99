"""The systemd unit for the head node: `dspark start --foreground` supervised, `dspark stop` to stop,
`dspark reload` for `systemctl reload` (live settings only).

Every path is quoted for systemd (a folder with spaces, `%` or `$` stays one literal
argument). Exit codes the unit relies on: 0 = the operator's own `stop`/`restart` took
the run over (not restarted: `Restart=on-failure`), 3 = already running and healthy,
143 = stopped by SIGTERM (both success); 1 = the server or a node's Ray was lost with recovery off
(DSPARK_RECOVERY_LIMIT=0), or supervision itself failed (restarted, at most START_LIMIT_BURST starts an hour);
4 = the supervisor's own recoveries reached DSPARK_RECOVERY_LIMIT within an hour (serve/recovery.py): the run is
stopped and the unit stays down (`RestartPreventExitStatus=4`) for an operator to look.
TimeoutStopSec covers `dspark stop`'s drain (DSPARK_DRAIN_TIMEOUT_S) on top of its own bounded waits.
"""

from __future__ import annotations

from pathlib import Path

from dspark_launch.config.checks import hidden_character
from dspark_launch.errors import EXIT_GAVE_UP, ConfigError


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
# systemd's own bound on restarting the unit after an exit 1: at most this many starts within an hour.
START_LIMIT_BURST = 5


def _one_line(label: str, text: str) -> None:
    """A control or invisible character (a newline above all) would end the unit's line and add one
    of its own (`ExecStartPre=`): refused, with the text shown escaped."""
    hidden = hidden_character(text, "")
    if hidden:
        raise ConfigError(
            f"{label} {ascii(text)} holds the control or invisible character {hidden}, which "
            "would add a line to the unit; allowed: a path without control characters"
        )


def unit_text(launcher: list[str], env_file: Path, user: str, drain_s: int = 0) -> str:
    """`drain_s`: DSPARK_DRAIN_TIMEOUT_S, which `dspark stop` (ExecStop) may spend letting requests finish."""
    env = str(env_file)
    for index, word in enumerate(launcher):
        _one_line("the launcher's path" if index == 0 else "the launcher's argument", word)
    _one_line("the env file's path", env)
    _one_line("the unit's user", user)
    start = command_line([*launcher, "start", "--foreground", "--env-file", env])
    stop = command_line([*launcher, "stop", "--env-file", env])
    reload = command_line([*launcher, "reload", "--env-file", env])
    return f"""[Unit]
Description=DeepSeek-V4-Flash on DGX Spark (dspark-launch: Ray across the nodes + vLLM)
Wants=network-online.target
After=network-online.target
# At most {START_LIMIT_BURST} starts within an hour (Restart=on-failure after an exit 1); then the unit stays failed.
StartLimitIntervalSec=3600
StartLimitBurst={START_LIMIT_BURST}

[Service]
Type=simple
User={user}
WorkingDirectory={_specifiers(str(env_file.parent))}
ExecStart={start}
ExecStop={stop}
# `systemctl reload`: live settings (the prefill cap, gate mode, aging, diagnostics) to the running scheduler;
# any other change fails it (exit 2, nothing changed) and needs `systemctl restart`.
ExecReload={reload}
# 3 = already running and healthy (e.g. started by hand before the unit); 143 = stopped by SIGTERM.
# 0 = an operator's `dspark stop` or `dspark restart` took the run over: not restarted.
SuccessExitStatus=3 143
# {EXIT_GAVE_UP} = the supervisor recovered DSPARK_RECOVERY_LIMIT times within an hour and the next loss came: it
# stopped the
# run; not restarted (`dspark status` and the journal say why). 1 (recovery off, or supervision failed): restarted.
RestartPreventExitStatus={EXIT_GAVE_UP}
Restart=on-failure
RestartSec=30
TimeoutStartSec=infinity
TimeoutStopSec={STOP_WITHOUT_DRAIN_S + drain_s}
KillMode=mixed

[Install]
WantedBy=multi-user.target"""
