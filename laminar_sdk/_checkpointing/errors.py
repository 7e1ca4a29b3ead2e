"""The checkpoint-store errors: each names the path (relative to the store) it is about."""

from __future__ import annotations

from laminar_sdk._contract.errors import CheckpointError


class CheckpointStoreError(CheckpointError):
    """A checkpoint-store operation failed on one file or object.

    :param message: what went wrong and what to do next.
    :param path: the file or object the error is about, relative to the store's location.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class CheckpointNotFound(CheckpointStoreError):
    """A manifest, artifact or pointer the caller asked for does not exist."""


class CheckpointCorrupted(CheckpointStoreError):
    """A manifest, artifact or pointer exists but is truncated, corrupted or fails its sha256.

    Never load such a checkpoint: recover from an older one (``load_latest_valid``).
    """


class UnsupportedManifestVersion(CheckpointCorrupted):
    """A manifest was written in a format version this SDK cannot read (a newer SDK?)."""

    def __init__(self, message: str, *, path: str, version: object) -> None:
        super().__init__(message, path=path)
        self.version = version


class CheckpointConflict(CheckpointStoreError):
    """Another writer already stored different content where this write was going.

    Raised instead of overwriting: a manifest, once stored, only ever moves its sinks forward
    (pending to committed or failed).
    """
