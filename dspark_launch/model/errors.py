"""Model failures the CLI maps to exit 1 (one line each, never a token)."""

from __future__ import annotations

from dspark_launch.errors import DsparkError


class ModelError(DsparkError):
    """The weights could not be fetched, placed or verified."""


class ModelAccessError(ModelError):
    """The hub refused the repository (gated, private, missing or wrong token, unknown revision)."""


class InsufficientDisk(ModelError):
    """A node lacks the free space the model needs; nothing was written there."""


class ModelIncomplete(ModelError):
    """Files are missing, partial or corrupt on a node after a pull or copy."""


class CopyFailed(ModelError):
    """rsync to a worker failed."""
