"""`VLLM_EXTRA_ARGS`: the `vllm serve` flags the launcher sets itself are refused there.

vLLM takes the last value of a repeated flag, so `--host 0.0.0.0` in the extra
arguments would open the API while `status` still shows 127.0.0.1, and
`--api-key X` would put a key on argv, in the state and in drift output. LAUNCHER_FLAGS
is the one list of those flags (a setting's flag from its declaration, then the flags no
setting gives); `docs/configuration.md` prints it.

vLLM's parser (FlexibleArgumentParser over argparse) accepts `--flag=value`,
`--flag value`, underscores for dashes (`--api_key`) and any unambiguous prefix
(`--hos`), and `-tp=2`, `-t 2`, `-n2` for its short aliases: all count.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark_launch.config.checks import Refused
from dspark_launch.config.declared import DECLARED
from dspark_launch.config.levels import Levels


@dataclass(frozen=True)
class LauncherFlag:
    spellings: tuple[str, ...]  # as in `vllm serve --help`: long flags, then short aliases
    setting: str  # the setting to use instead; "" when there is none
    why: str = ""  # why there is none


_MULTI_NODE = "Ray replaces vLLM's multi-node mode"
# The flags no setting gives (a setting's own flag is in its declaration: config/knobs.py, config/text_settings.py).
UNSET_FLAGS: tuple[LauncherFlag, ...] = (
    LauncherFlag(("--pipeline-parallel-size", "-pp"), "", "tensor parallel across the nodes"),
    LauncherFlag(("--distributed-executor-backend",), "", "always Ray"),
    LauncherFlag(
        ("--headless", "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port"), "", _MULTI_NODE
    ),
    LauncherFlag(
        ("--enable-chunked-prefill", "--no-enable-chunked-prefill", "--disable-chunked-prefill"),
        "",
        "the hotfix needs chunked prefill on",
    ),
    LauncherFlag(("--config",), "", "a config file could set any flag here"),
    LauncherFlag(
        ("--disable-uvicorn-access-log", "--no-disable-uvicorn-access-log", "--enable-uvicorn-access-log"),
        "",
        "the access log is off: its lines have no vLLM prefix and a client-chosen X-Forwarded-For, so a "
        "local client could write log lines",
    ),
    LauncherFlag(
        (
            "--data-parallel-size-local",
            "--data-parallel-rank",
            "--data-parallel-start-rank",
            "--data-parallel-address",
            "--data-parallel-rpc-port",
            "--data-parallel-backend",
            "--data-parallel-hybrid-lb",
            "--no-data-parallel-hybrid-lb",
            "--data-parallel-external-lb",
            "--no-data-parallel-external-lb",
            "--data-parallel-multi-port-external-lb",
            "--data-parallel-supervisor-port",
            "-dpl",
            "-dpn",
            "-dpr",
            "-dpa",
            "-dpp",
            "-dpb",
            "-dph",
            "-dpe",
            "-dpm",
        ),
        "",
        "data-parallel engines run on the head behind one API server (`--data-parallel-size` only), "
        "where `reload` and `stop` reach them",
    ),
)


def launcher_flags(levels: Levels) -> tuple[LauncherFlag, ...]:
    """The settings' flags (in declaration order), then those no setting gives."""
    return (
        *(LauncherFlag(owned.spellings, " or ".join(owned.settings), owned.why) for owned in levels.owned_flags),
        *UNSET_FLAGS,
    )


LAUNCHER_FLAGS: tuple[LauncherFlag, ...] = launcher_flags(DECLARED)

# Flags whose value is a secret (vLLM's own list: `_SENSITIVE_ARG_FIELDS` in
# vllm/entrypoints/serve/utils/api_utils.py, redacted in its log): on the `vllm serve` argv a secret is
# world-readable in /proc, and VLLM_EXTRA_ARGS is kept in the state and shown by `config show`.
SECRET_FLAGS: tuple[LauncherFlag, ...] = (
    LauncherFlag(("--hf-token",), "", "weights are local; `dspark model pull` uses the hub login"),
    LauncherFlag(("--watermark-config",), "", "a secret key no setting carries"),
)

# vLLM options that are prefixes of a refused flag but name a flag of their own: argparse takes an exact
# match before an abbreviation (the parser test checks every option vLLM knows against this module).
OTHER_EXACT_OPTIONS = frozenset({"--watermark", "--data-parallel-size", "-dp"})


def _owner(word: str) -> tuple[str, LauncherFlag] | None:
    """The refused flag `word` reaches in vLLM's parser (exactly or abbreviated), with its spelling."""
    name = word.split("=", 1)[0]
    if (name.replace("_", "-") if name.startswith("--") else name) in OTHER_EXACT_OPTIONS:
        return None
    if name.startswith("--"):
        name = name.replace("_", "-")
        for flag in LAUNCHER_FLAGS + SECRET_FLAGS:
            for spelling in flag.spellings:
                if spelling.startswith("--") and len(name) > 2 and spelling.startswith(name):
                    return spelling, flag
        return None
    for flag in LAUNCHER_FLAGS:
        for spelling in flag.spellings:
            if spelling.startswith("--"):
                continue
            # `-t` abbreviates `-tp`; a one-letter option takes its value attached (`-n2`).
            if (len(name) >= 2 and spelling.startswith(name)) or (len(spelling) == 2 and name.startswith(spelling)):
                return spelling, flag
    return None


def check_extra_args(words: list[str]) -> None:
    """Refused naming the first word that sets a launcher flag; never shows any value."""
    if words and not words[0].startswith("-"):
        raise Refused(
            "starts with a positional argument, which vllm serve takes as the model; "
            "allowed: flags only; set the model in DSPARK_MODEL"
        )
    for word in words:
        if not word.startswith("-") or word == "-" or word[1:2].isdigit():
            continue  # a value, or a negative number
        owner = _owner(word)
        if owner:
            spelling, flag = owner
            shown = word.split("=", 1)[0]
            shown = spelling if not shown.startswith("--") and len(shown) > len(spelling) else shown  # `-n2`
            reached = "" if shown.replace("_", "-") == spelling else f" (vLLM reads it as {spelling})"
            allowed = f"set {flag.setting} instead" if flag.setting else f"leave it out ({flag.why})"
            if flag in SECRET_FLAGS:
                raise Refused(
                    f"holds {shown}{reached}, whose value is a secret (on the vllm serve argv it is "
                    f"readable by every local user; the value is not shown); allowed: {allowed}"
                )
            raise Refused(f"holds {shown}{reached}, which the launcher sets; allowed: {allowed}")
