"""`dspark config ...`: show, check, get and init the settings. Never imports ray, vllm or torch."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Annotated

import typer

from dspark_launch.cli.options import EnvFileOption, JsonOption, StrictOption
from dspark_launch.cli.output import emit_json, fail, say, table
from dspark_launch.errors import ConfigError, DsparkError

app = typer.Typer(help="Show, check and initialise the configuration.", no_args_is_help=True)


def load_settings(env_file: str | None, strict: bool = False):
    from dspark_launch.cli.loading import settings_or_exit

    return settings_or_exit(env_file, strict=strict)


@app.command()
def show(
    env_file: EnvFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every setting with its effective value, where it came from, and notes."""
    from dspark_launch.config.profile_resolve import profile_values

    settings = load_settings(env_file)
    replaced = {v.setting: v for v in profile_values(settings)}

    def shown(e) -> tuple[str, str, list[str]]:
        """Value, source, notes; a value the profile replaced shows as the profile's, marked."""
        if e.name not in replaced:
            return e.shown, e.source, list(e.notes)
        v = replaced[e.name]
        return (
            v.value,
            f"profile {v.profile}",
            [f"the profile replaced the built-in {v.replaced or '(empty)'}", *e.notes],
        )

    entries = settings.every_entry()
    if as_json:
        emit_json(
            {
                "env_file": None if settings.env_file is None else str(settings.env_file),
                "from_example": settings.from_example,
                "settings": [
                    {
                        "name": e.name,
                        "value": value,
                        "source": source,
                        "group": e.group,
                        "secret": e.secret,
                        "notes": notes,
                    }
                    for e in entries
                    for value, source, notes in (shown(e),)
                ],
                "warnings": list(settings.warnings),
            }
        )
        return
    say(f"env file: {settings.env_file_shown}{'  (example)' if settings.from_example else ''}")
    for group in dict.fromkeys(e.group for e in entries):
        rows = [
            (e.name, value or '""', source, "; ".join(notes))
            for e in entries
            if e.group == group
            for value, source, notes in (shown(e),)
        ]
        say(f"\n[{group}]")
        say(table(("NAME", "VALUE", "SOURCE", "NOTES"), rows, indent="  "))


@app.command()
def check(
    env_file: EnvFileOption = None,
    strict: StrictOption = False,
) -> None:
    """Exit 0 when the configuration is valid, 2 when it is not (one line naming the setting, its value, file:line and
    what is allowed; the example's placeholder hosts and interface included)."""
    from dspark_launch.config.placeholders import placeholder_error, placeholders

    settings = load_settings(env_file, strict=strict)
    found = placeholders(settings)
    if found:
        raise fail(ConfigError(placeholder_error(found)))
    say(f"configuration OK: {len(settings.every_entry())} settings, env file {settings.env_file_shown}")


@app.command()
def get(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Setting name, e.g. DSPARK_MAX_INFLIGHT_PREFILLS.")],
    env_file: EnvFileOption = None,
) -> None:
    """The effective value of one setting, alone (the profile's where it replaced the default; secrets as set/unset)."""
    from dspark_launch.config.registry import load_registry

    canonical = load_registry().aliases.get(name, name)
    settings = load_settings(env_file)
    entry = settings.named(canonical)  # the name the operator typed
    if entry is None:
        raise fail(ConfigError(f"{name}: no such setting; allowed: a name from `dspark config show`"))
    from dspark_launch.config.profile_resolve import profile_values

    replaced = {v.setting: v.value for v in profile_values(settings)}
    say(replaced.get(canonical, entry.shown))


@app.command()
def init(
    path: Annotated[Path, typer.Option("--path", metavar="PATH", help="Where to write the env file.")] = Path(
        ".env.dspark"
    ),
) -> None:
    """Copy the example to .env.dspark with mode 0600; never overwrites. Then edit the lines `dspark config check`
    names."""
    from dspark_launch.config.envfile import packaged_example

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise fail(DsparkError(f"{path} already exists; edit it, or remove it first")) from None
    except OSError as exc:
        raise fail(DsparkError(f"{path}: cannot create it ({exc.strerror})")) from None
    with os.fdopen(fd, "wb") as out, open(packaged_example(), "rb") as example:
        shutil.copyfileobj(example, out)
    say(f"wrote {path} (mode 0600); set DSPARK_HEAD_IP, DSPARK_WORKER_HOSTS and DSPARK_FABRIC_IFNAME")
