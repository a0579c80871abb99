"""Salted digests of the secret settings, so that a rotated key is drift (never the secret itself).

Public values show a secret as set/unset: safe to print and store, but blind to a new key. The
deployment record therefore also keeps, per secret that is set, `hmac-sha256:SALT:DIGEST` with a
random salt of its own (the salt makes the digest useless for checking guesses across records and
hosts; the record is 0600 in a private folder anyway). Comparing recomputes the digest with the
recorded salt.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from dspark_launch.config.settings import Settings

ROTATED = "set (another value)"  # how a secret that changed is shown in drift and restart reasons


def digest(value: str, salt: str | None = None) -> str:
    salt = salt or secrets.token_hex(16)
    return f"hmac-sha256:{salt}:{hmac.new(bytes.fromhex(salt), value.encode(), hashlib.sha256).hexdigest()}"


def matches(recorded: str, value: str) -> bool:
    kind, _, rest = recorded.partition(":")
    salt, _, _ = rest.partition(":")
    try:
        return kind == "hmac-sha256" and hmac.compare_digest(recorded, digest(value, salt))
    except ValueError:  # not hex: an unreadable record never matches
        return False


def secret_digests(settings: Settings) -> dict[str, str]:
    """Every secret setting that is set, each with a salt of its own."""
    return {name: digest(entry.value) for name, entry in settings.entries.items() if entry.secret and entry.value}


def rotated(recorded: dict[str, str], settings: Settings) -> list[str]:
    """Secrets set at start and now, to another value (set/unset changes show in the public values)."""
    return sorted(
        name
        for name, entry in settings.entries.items()
        if entry.secret and entry.value and name in recorded and not matches(recorded[name], entry.value)
    )


def compared_values(settings: Settings, recorded: dict[str, str]) -> dict[str, str]:
    """The public values, a rotated secret shown as ROTATED: what drift, restart and reload compare."""
    values = settings.public_values()
    values.update({name: ROTATED for name in rotated(recorded, settings)})
    return values
