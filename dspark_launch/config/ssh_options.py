"""`DSPARK_SSH_OPTIONS`: the few ssh options an operator needs, and nothing else.

ssh runs local commands (`ProxyCommand`, `LocalCommand`, `KnownHostsCommand`,
`-F` with a `Match exec`), forwards the agent (`-A`) and can be told to trust any
host key; none of that may come in through a setting. Every allowed option is
rewritten to one `-o Keyword=value` pair, so the value ssh receives is exactly the
one checked here.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

from dspark_launch.config.checks import Refused, hidden_character, shell_words


@dataclass(frozen=True)
class SshOption:
    keyword: str  # the ssh_config keyword, as `-o Keyword=value`
    short: str  # the short option ssh also accepts for it ("" when none)
    value: str  # what the value must be: "FILE", "[user@]host[:port]", "N"
    meaning: str


ALLOWED: tuple[SshOption, ...] = (
    SshOption("IdentityFile", "-i", "FILE", "another private key to try (DSPARK_SSH_KEY is the first)"),
    SshOption("CertificateFile", "", "FILE", "an SSH certificate for the key"),
    SshOption("UserKnownHostsFile", "", "FILE", "the known-hosts file holding the workers' keys (not /dev/null)"),
    SshOption("ProxyJump", "-J", "[user@]host[:port][,...]", "reach the workers through a jump host"),
    SshOption("ServerAliveInterval", "", "N", "seconds between keep-alive probes"),
    SshOption("ServerAliveCountMax", "", "N", "unanswered keep-alive probes before ssh gives up"),
    SshOption("ConnectionAttempts", "", "N", "connection attempts before ssh gives up"),
)

# Options with a setting of their own: the launcher puts those first, where ssh takes the first value.
OWNED: dict[str, str] = {
    "-p": "SSH_PORT",
    "Port": "SSH_PORT",
    "-l": "DSPARK_SSH_USER (or user@host in DSPARK_WORKER_HOSTS)",
    "User": "DSPARK_SSH_USER",
    "ConnectTimeout": "SSH_CONNECT_TIMEOUT_S",
    "StrictHostKeyChecking": "DSPARK_SSH_HOST_KEY_CHECK (yes or accept-new)",
}
# Why the most tempting refused options are refused, for the error line.
DANGER: dict[str, str] = {
    "-A": "forwards your SSH agent to the workers",
    "ForwardAgent": "forwards your SSH agent to the workers",
    "ProxyCommand": "runs a local command",
    "LocalCommand": "runs a local command",
    "PermitLocalCommand": "lets LocalCommand run a local command",
    "KnownHostsCommand": "runs a local command",
    "-F": "reads another ssh config, which can run commands",
}
# Lookup keys: a short option as spelled (case matters), an ssh_config keyword in lower case.
_OWNED = {key if key.startswith("-") else key.lower(): use for key, use in OWNED.items()}
_DANGER = {key if key.startswith("-") else key.lower(): why for key, why in DANGER.items()}
_JUMP = re.compile(r"(?:[A-Za-z0-9_.-]+@)?(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?", re.ASCII)
_COUNT = re.compile(r"[0-9]{1,4}", re.ASCII)
_KEYWORD_VALUE = re.compile(r"([A-Za-z]+)(?:[ \t]*=[ \t]*|[ \t]+)(.*)")
_BY_KEYWORD = {option.keyword.lower(): option for option in ALLOWED}
_BY_SHORT = {option.short: option for option in ALLOWED if option.short}


def allowed_summary() -> str:
    forms = [f"{o.short} {o.value}" for o in ALLOWED if o.short] + [f"-o {o.keyword}={o.value}" for o in ALLOWED]
    return ", ".join(forms)


def _refuse(spelled: str, key: str) -> Refused:
    if key in _OWNED:
        return Refused(f"holds {spelled}, which the launcher sets; allowed: set {_OWNED[key]} instead")
    why = f" ({_DANGER[key]})" if key in _DANGER else ""
    return Refused(f"holds {spelled}{why}, not an allowed ssh option; allowed: {allowed_summary()}")


def _checked_value(option: SshOption, value: str) -> str:
    spelled = f"{option.keyword}={value}"
    if hidden_character(value, "") or not value:
        raise Refused(
            f"holds {option.keyword} with an empty value or a control character; allowed: {allowed_summary()}"
        )
    if option.value == "FILE":
        if any(c.isspace() or c in "\"'\\" for c in value) or value.startswith("-"):
            raise Refused(f"holds {shlex.quote(spelled)}; allowed: a path without spaces, quotes or a leading '-'")
        if option.keyword == "UserKnownHostsFile" and (
            value.lower() == "none" or os.path.realpath(value) == os.devnull
        ):
            raise Refused(f"holds {shlex.quote(spelled)}, which trusts any host key; allowed: a real known-hosts file")
    elif option.value == "N":
        if not _COUNT.fullmatch(value):
            raise Refused(f"holds {shlex.quote(spelled)}; allowed: a whole number of at most 4 digits")
    elif not all(_JUMP.fullmatch(hop) and not hop.startswith("-") for hop in value.split(",")):
        raise Refused(f"holds {shlex.quote(spelled)}; allowed: {option.value}")
    return value


def _pairs(words: list[str]):
    """(spelling, option, value) for each option in ssh's own argv syntax."""
    index = 0
    while index < len(words):
        word = words[index]
        flag = word[:2]
        if not word.startswith("-") or word.startswith("--") or flag not in ("-o", *_BY_SHORT):
            spelled = word.split("=", 1)[0] if word.startswith("--") else flag if word.startswith("-") else word
            raise _refuse(shlex.quote(spelled), flag)
        if len(word) > 2:
            argument, index = word[2:], index + 1  # getopt: `-oKey=value`, `-iFILE`
        elif index + 1 < len(words):
            argument, index = words[index + 1], index + 2
        else:
            raise Refused(f"ends with {flag} and no value; allowed: {allowed_summary()}")
        if flag in _BY_SHORT:
            yield flag, _BY_SHORT[flag], argument
            continue
        match = _KEYWORD_VALUE.fullmatch(argument.strip())
        if not match:
            raise Refused(f"holds -o {shlex.quote(argument)}; allowed: -o Keyword=value, one of {allowed_summary()}")
        keyword = match.group(1).lower()
        if keyword not in _BY_KEYWORD:
            raise _refuse(f"-o {match.group(1)}", keyword)
        yield f"-o {match.group(1)}", _BY_KEYWORD[keyword], match.group(2).strip()


def check_ssh_options(value: str) -> str:
    """The options as `-o Keyword=value` pairs (shell-quoted), or Refused naming the first refused one."""
    words = shell_words(value)
    canonical: list[str] = []
    for _, option, argument in _pairs(words):
        canonical += ["-o", f"{option.keyword}={_checked_value(option, argument)}"]
    return shlex.join(canonical)
