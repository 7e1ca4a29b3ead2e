"""The sink's directory layout, and the one rename that publishes an epoch.

::

    path/epoch=<e, 20 digits>/<data files>        a published epoch
    path/epoch=<e, 20 digits>/_MANIFEST.json      its files and row count
    path/_staging/epoch-<e>/...                   an epoch being written: invisible to readers
    path/_staging/epoch-<e>/_MANIFEST.json        the files to publish (once pre-committed)
    path/_staging/publishing-<e>/...              the files of an epoch being published
    path/_LAYOUT.json                             says the directory holds this layout

The published directories are Hive-style partitions (``epoch=<e>``), so Spark's
``spark.read.parquet(path)``, ``pyarrow.parquet.read_table(path)``, ``pyarrow.dataset`` and
``pandas.read_parquet(path)`` read the sink's directory as it is, with their defaults (those
that discover partitions add an ``epoch`` column). They all skip names starting with ``_`` or
``.``, so they see the published epochs only. An epoch is published by renaming the directory
its files were gathered in, so a reader sees all of it or none, and the published directory is
the durable record that the epoch is committed.

Earlier releases of this plugin published epochs as ``epoch-<e>/``: :func:`check_layout`
refuses a directory holding those (its documentation says how to migrate one).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from laminar_sdk import (
    ConfigurationError,
    InvalidState,
    TransactionError,
    fsync_path,
    make_dirs,
    write_file_atomically,
)

STAGING = "_staging"
MANIFEST = "_MANIFEST.json"
PARTITION_COLUMN = "epoch"
"""The column readers that discover Hive-style partitions add: the epoch of each row."""
LAYOUT_MARKER = "_LAYOUT.json"
"""A file saying the directory holds the ``epoch=<e>`` layout (checked once, then trusted)."""

_LAYOUT = {"published": f"{PARTITION_COLUMN}=<epoch, 20 digits>"}
_OLD_PUBLISHED = re.compile(r"epoch-\d{20}")


@dataclass(frozen=True, slots=True)
class EpochFiles:
    """The data files of an epoch and the rows they hold, as its manifest records them."""

    epoch: int
    files: tuple[str, ...]
    rows: int

    def to_json(self) -> str:
        """Canonical JSON text (also the commit descriptor of a staging task)."""
        record = {"epoch": self.epoch, "files": list(self.files), "rows": self.rows}
        return json.dumps(record, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, label: str, text: str, epoch: int) -> EpochFiles:
        """Parse :meth:`to_json` output recorded for ``epoch``.

        :raises TransactionError: when ``text`` is not such a record, is for another epoch,
            or names a file outside the staging directory.
        """
        try:
            record = json.loads(text)
            files = tuple(record["files"])
            recorded, rows = record["epoch"], record["rows"]
        except (ValueError, TypeError, KeyError) as error:
            raise TransactionError(
                f"{label}: {text[:200]!r} is not a record of staged files of this sink"
            ) from error
        if recorded != epoch or not isinstance(rows, int):
            raise TransactionError(
                f"{label}: a record of staged files for epoch {recorded} was given for epoch "
                f"{epoch}"
            )
        for name in files:
            if not isinstance(name, str) or "/" in name or name.startswith((".", "_")):
                raise TransactionError(
                    f"{label}: the record of staged files of epoch {epoch} names {name!r}, "
                    "which is not a data file name this sink writes"
                )
        return cls(epoch, files, rows)


def _check_epoch(epoch: int) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"files sink: an epoch is an int >= 0, got {epoch!r}")


def staging_directory(directory: Path, epoch: int) -> Path:
    """Where ``epoch`` is staged."""
    _check_epoch(epoch)
    return directory / STAGING / f"epoch-{epoch}"


def published_directory(directory: Path, epoch: int) -> Path:
    """Where ``epoch`` is once published: a Hive-style partition directory, ``epoch=<e>``.

    The number is zero-padded, so that names sort as epochs do; readers that discover
    partitions still read it as the integer ``e``.
    """
    _check_epoch(epoch)
    return directory / f"{PARTITION_COLUMN}={epoch:020d}"


_PUBLISHED = re.compile(rf"{PARTITION_COLUMN}=(\d{{20}})")


def last_published(directory: Path) -> int:
    """The newest epoch published in ``directory`` (``-1``: none)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return -1
    published = (_PUBLISHED.fullmatch(name) for name in names)
    return max((int(match[1]) for match in published if match), default=-1)


def check_layout(label: str, directory: Path, key: str) -> None:
    """Refuse ``directory`` when it holds epochs an earlier release published as ``epoch-<e>/``.

    Writing the new layout next to them would mix two layouts that no reader discovering
    partitions accepts, and an epoch committed under the old name would not be recognised
    when delivered again. The directory is listed once: when it holds no old epoch,
    :data:`LAYOUT_MARKER` is written, and later calls only look for that file.

    To keep such a directory, stop every pipeline writing to it and rename each published
    epoch (``cd PATH && for d in epoch-*; do mv "$d" "epoch=${d#epoch-}"; done``); staged
    epochs need nothing.

    :param key: the configuration key naming ``directory``, for the error.
    :raises ConfigurationError: naming ``directory``, the old directories and the fix.
    """
    marker = directory / LAYOUT_MARKER
    if marker.exists():
        return
    old = sorted(name for name in os.listdir(directory) if _OLD_PUBLISHED.fullmatch(name))
    if old:
        raise ConfigurationError(
            f"{label}: config key {key!r} names {directory}, which holds {len(old)} epoch(s) "
            f"published by an older laminar-plugin-files ({old[0]}/ ...); this release "
            f"publishes epochs as Hive-style {PARTITION_COLUMN}=<e>/ directories, which Spark, "
            "pyarrow and pandas read as they are. Stop every pipeline writing there and rename "
            f"them: cd {shlex.quote(str(directory))} && "
            'for d in epoch-*; do mv "$d" "epoch=${d#epoch-}"; done'
            f" — or point {key!r} at a new directory",
            key=key,
        )
    write_file_atomically(marker, json.dumps(_LAYOUT).encode())


def read_staged_manifest(label: str, directory: Path, epoch: int) -> EpochFiles:
    """The manifest ``pre_commit`` left in ``epoch``'s staging directory.

    :raises InvalidState: when there is none (never pre-committed, or rolled back).
    """
    staging = staging_directory(directory, epoch)
    try:
        text = (staging / MANIFEST).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidState(
            f"epoch {epoch} pre-committed in {directory}",
            f"epoch {epoch} was never pre-committed there, or was rolled back",
        ) from None
    return EpochFiles.from_json(label, text, epoch)


def publish(label: str, directory: Path, staged: EpochFiles) -> bool:
    """Publish the staged files ``staged`` names as their epoch, with one directory rename.

    The named files are moved into a directory of their own (``_staging/publishing-<e>``),
    which is renamed to the published directory; what is left in the staging directory — files
    no descriptor names, of failed attempts or crashed runs, or written by a straggling attempt
    meanwhile — is deleted afterwards and can never be published. Idempotent: a call
    interrupted anywhere can be repeated (see :func:`published_before`).

    :returns: ``True`` when this call published the epoch.
    :raises TransactionError: when a named file is not staged (the staging was discarded).
    """
    if published_before(directory, staged.epoch):
        return False
    published = published_directory(directory, staged.epoch)
    staging = staging_directory(directory, staged.epoch)
    assembly = _assembly_directory(directory, staged.epoch)
    make_dirs(assembly)
    for name in staged.files:
        if (staging / name).exists():
            os.rename(staging / name, assembly / name)
        elif not (assembly / name).exists():
            raise TransactionError(
                f"{label}: cannot publish epoch {staged.epoch}: staged file {name} is gone from "
                f"{staging} (the epoch was rolled back or its staging deleted); the epoch must "
                "be written again"
            )
    for name in set(os.listdir(assembly)) - set(staged.files) - {MANIFEST}:
        _remove(assembly / name)  # moved there by an interrupted call with other descriptors
    # Written last, and with the directory fsynced: the moves above are durable too.
    write_file_atomically(assembly / MANIFEST, staged.to_json().encode())
    try:
        os.rename(assembly, published)
    except OSError:
        if published.exists():
            return False  # another committer was first: the epoch is published once
        raise
    fsync_path(directory)
    fsync_path(assembly.parent)
    _remove(staging)
    return True


def published_before(directory: Path, epoch: int) -> bool:
    """Whether ``epoch`` is published; if so, what its commit left staged is deleted."""
    if not published_directory(directory, epoch).exists():
        return False
    discard_staging(directory, epoch)
    return True


def discard_staging(directory: Path, epoch: int) -> None:
    """Delete everything staged for ``epoch``; a published epoch is not touched.

    The manifest goes first, durably, so an interrupted discard never leaves a part of the
    epoch that looks pre-committed.
    """
    staging = staging_directory(directory, epoch)
    manifest = staging / MANIFEST
    if manifest.exists():
        manifest.unlink()
        fsync_path(staging)
    _remove(staging)
    _remove(_assembly_directory(directory, epoch))
    fsync_path(staging.parent)


def _assembly_directory(directory: Path, epoch: int) -> Path:
    """Where the files of ``epoch`` are gathered just before the rename that publishes them."""
    return directory / STAGING / f"publishing-{epoch}"


def _remove(path: Path) -> None:
    """Delete ``path``, a file or a directory tree, if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def combined(label: str, epoch: int, parts: Sequence[EpochFiles]) -> EpochFiles:
    """The files of every one of ``parts`` (the records of several writers) as one epoch.

    :raises TransactionError: naming a file that two parts list.
    """
    files: list[str] = []
    for part in parts:
        files += part.files
    twice = sorted(name for name, count in Counter(files).items() if count > 1)
    if twice:
        raise TransactionError(
            f"{label}: staged file(s) {', '.join(twice[:5])} of epoch {epoch} are named by "
            "more than one commit descriptor; each write task must stage under a task name "
            "of its own"
        )
    return EpochFiles(epoch, tuple(files), sum(part.rows for part in parts))
