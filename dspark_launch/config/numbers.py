"""The number rules shared, character for character, with the bash side of the registry.

Only ASCII digits count (Python's `int("٣")` would accept an Arabic-Indic digit;
bash would not, so neither do we). Values are compared as decimal strings, so a
30-digit number is compared exactly, never overflowed or rounded.
"""

from __future__ import annotations

import re

_WHITESPACE = " \t\r\n"
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?([0-9]*)(?:\.([0-9]*))?", re.ASCII)


def trim(text: str) -> str:
    return text.strip(_WHITESPACE)


def canonical(type_: str, text: str) -> str | None:
    """The canonical spelling of a number of `type_`, or None when `text` is not one."""
    sign = "-" if text.startswith("-") else ""
    if type_ == "int":
        if not _INT.fullmatch(text):
            return None
        whole, fraction = text.lstrip("+-"), None
    else:
        match = _FLOAT.fullmatch(text)
        if not match or not (match.group(1) or match.group(2)):
            return None
        whole, fraction = match.group(1), (match.group(2) or "").rstrip("0") or "0"
    whole = whole.lstrip("0") or "0"
    if whole == "0" and fraction in (None, "0"):
        sign = ""
    return f"{sign}{whole}" if fraction is None else f"{sign}{whole}.{fraction}"


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 for two canonical numbers."""
    if a.startswith("-") != b.startswith("-"):
        return -1 if a.startswith("-") else 1
    if a.startswith("-"):
        return compare(b[1:], a[1:])
    a_whole, _, a_frac = a.partition(".")
    b_whole, _, b_frac = b.partition(".")
    if len(a_whole) != len(b_whole):
        return -1 if len(a_whole) < len(b_whole) else 1
    width = max(len(a_frac), len(b_frac))
    left, right = a_whole + a_frac.ljust(width, "0"), b_whole + b_frac.ljust(width, "0")
    return (left > right) - (left < right)
