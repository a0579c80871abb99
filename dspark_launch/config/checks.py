"""Character rules shared by the text settings' checks.

A check raises ValueError with the "allowed" half of an error line (the caller
shows the whole value), or `Refused` with a clause that names the offending part
itself, so that the caller shows that part and never the rest of the value (an
`--api-key` inside `VLLM_EXTRA_ARGS` must not be echoed).
"""

from __future__ import annotations

import re
import shlex
import unicodedata

# Line endings and tabs separate words in list settings and quoted multi-line values.
SEPARATORS = "\t\n\r"
# Cc: control characters (NUL, ESC, DEL, C1); Cf: invisible format characters (bidi
# overrides, zero-width); Zl/Zp: separators that `str.splitlines` breaks lines at.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
ASCII_WORD = re.compile(r"[!-~]+", re.ASCII)  # printable ASCII, no space
SECRET_WORDS = ("KEY", "TOKEN", "PASSWORD", "PASSWD", "PASSPHRASE", "SECRET", "CREDENTIAL", "AUTH", "COOKIE", "PRIVATE")
_SECRET_WORDS = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
_USER_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,31}", re.ASCII)


class Refused(ValueError):
    """A value refused by a clause that names what is wrong; the value itself is not shown."""


def shell_words(value: str) -> list[str]:
    """`value` split like a shell would (never run by one); Refused when it does not split."""
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise Refused(f"does not split like a shell would ({exc}); allowed: shell words") from None


def looks_secret(name: str) -> bool:
    """A variable name that looks like it holds a key, token, password or credential."""
    return bool(_SECRET_WORDS.search(name))


def hidden_character(value: str, allowed: str = SEPARATORS) -> str | None:
    """The first control or invisible character of `value` (outside `allowed`), as U+XXXX."""
    for char in value:
        if char not in allowed and unicodedata.category(char) in _HIDDEN_CATEGORIES:
            return f"U+{ord(char):04X}"
    return None


def single_line(value: str) -> str:
    """One value on one line: no tab, CR or LF either."""
    if hidden_character(value, ""):
        raise ValueError("one value on one line, without tabs or control characters")
    return value


def not_an_option(value: str) -> str:
    """A value passed as its own argument: a leading '-' would make it an option."""
    single_line(value)
    if value.startswith("-"):
        raise ValueError("a value that does not start with '-'")
    return value


def user_name(value: str) -> str:
    """A login name (DSPARK_SSH_USER, the systemd unit's User=)."""
    if not _USER_NAME.fullmatch(value):
        raise ValueError("a user name: letters, digits and ._-, not starting with '-', at most 32")
    return value
