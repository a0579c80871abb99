"""Settings and the cluster spec for a command: loaded once, errors as exit codes, warnings printed."""

from __future__ import annotations

from dspark_launch.cli.output import fail, warn_all
from dspark_launch.errors import DsparkError


def settings_or_exit(env_file: str | None, cli: dict | None = None, strict: bool = False):
    from dspark_launch.config.load import load_settings, refuse_warnings

    try:
        settings = load_settings(env_file, cli)
        warn_all(settings.warnings)
        if strict:
            refuse_warnings(settings)
    except DsparkError as error:
        raise fail(error) from None
    return settings


def settings_and_spec(env_file: str | None, host: str | None = None, port: str | None = None, strict: bool = False):
    """What every cluster or service command starts from (`strict`: configuration warnings are errors)."""
    from dspark_launch.cluster.spec import cluster_spec
    from dspark_launch.config.load import serve_overrides

    settings = settings_or_exit(env_file, serve_overrides(host, port), strict)
    try:
        return settings, cluster_spec(settings)
    except DsparkError as error:
        raise fail(error) from None
