"""Exit codes and the errors that carry them; one meaning everywhere."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2
EXIT_ALREADY_RUNNING = 3
EXIT_GAVE_UP = 4  # `start --foreground`: the hourly recovery limit reached, this run stopped (the unit stays down)
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class DsparkError(Exception):
    """An operator-facing failure: one line, and the exit code it maps to."""

    exit_code = EXIT_FAILED
    # What the failed command's rollback stopped ("Ray on every node", ...); empty: it had started nothing.
    stopped: tuple[str, ...] = ()


class ConfigError(DsparkError):
    """Bad configuration: nothing was started or written."""

    exit_code = EXIT_BAD_CONFIG


class ClusterFailure(DsparkError):
    """A step failed on a node; `node` and `step` say where."""

    def __init__(self, node: str, step: str, detail: str, extra: list[str] | tuple[str, ...] | None = None):
        super().__init__(f"{node}: {step}: {detail}")
        self.node, self.step, self.detail = node, step, detail
        self.extra = list(extra or [])  # lines to show after the error (a version matrix, ...)


class VersionMismatch(ClusterFailure):
    """The node runs another launcher (or protocol) version: nothing is started anywhere."""


class Terminated(BaseException):
    """SIGTERM arrived; like KeyboardInterrupt, it unwinds through rollbacks."""
