"""Settings for a command, resolved once: the one loader every CLI command uses."""

from __future__ import annotations

from dspark_launch.config.settings import Settings, resolve
from dspark_launch.errors import ConfigError


def load_settings(env_file: str | None, cli: dict[str, tuple[str, str]] | None = None) -> Settings:
    """Resolve every setting once (raises ConfigError); the caller shows `settings.warnings`."""
    return resolve(env_file=env_file, cli=cli or {})


def refuse_warnings(settings: Settings) -> None:
    """`--strict`: any warning is an error."""
    if settings.warnings:
        raise ConfigError(f"{len(settings.warnings)} warning(s) and --strict is set")


def serve_overrides(host: str | None, port: str | None) -> dict[str, tuple[str, str]]:
    """`--host` / `--port` as settings that beat VLLM_HOST / VLLM_PORT."""
    cli = {}
    if host is not None:
        cli["VLLM_HOST"] = (host, "--host")
    if port is not None:
        cli["VLLM_PORT"] = (port, "--port")
    return cli
