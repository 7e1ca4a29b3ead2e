"""Handing a write task's batches to a one-instance commit through a file, not a message.

A commit message travels from the write task through the JVM to the Python worker that
commits, copied several times on the way: two tasks' 12 MB each took 0.15 to 0.25 s to
arrive. A task that can write where the committing worker reads — a task on the driver's
machine (every task, in ``local`` mode), or on a file system the driver shares — instead
writes its batches to a file there and sends only its name: the commit reads the file, and no
byte crosses the JVM.

Which tasks can is checked, not assumed. The driver keeps a random token in
``<temp>/laminar-spark-<user id>/driver-token`` (made once; :meth:`HandoffDirectory.of_driver`)
and gives it to the writer Spark ships to the tasks. A task uses the directory only when it reads
the same token there (:meth:`HandoffDirectory.reachable`); any other task — on another
machine, in another container, with another temporary directory — sends its batches in the
commit message as before. A token that changed (a temporary-file cleaner removed it) only
sends batches in messages until the next writer.

The files hold a micro-batch's records: the directory is the user's own, readable by no one
else (mode 0700), and a directory of that name that another user owns, or that others may
read, is not used (a warning says so). They are transport, not durable state: nothing is
fsynced. They live under the query's id and the micro-batch's, and the commit removes the
micro-batch's directory when it ends, committed or failed — also the files of task attempts
that failed and of micro-batches a crashed run left behind. Once an epoch's commit is
decided, the sink's own staging (never these files) is what finishes it.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("laminar_sdk.spark")

_TOKEN_FILE = "driver-token"  # noqa: S105 - a file name; the token proves a path, guards nothing
_BATCH = re.compile(r"batch-(\d+)")


def default_root() -> Path:
    """``<temp>/laminar-spark-<user id>``, in the temporary directory Python finds."""
    return Path(tempfile.gettempdir()) / f"laminar-spark-{_user()}"


def _user() -> str:
    uid = _uid()
    return str(uid) if uid is not None else getpass.getuser()


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)  # POSIX only
    return None if getuid is None else getuid()


@dataclass(frozen=True, slots=True)
class HandoffDirectory:
    """The driver's hand-off directory, and the token that proves a task sees the same one.

    Plain, picklable data: it travels to the tasks inside the writer.

    :param root: the directory, as the driver names it.
    :param token: what its token file held on the driver.
    """

    root: str
    token: str

    @classmethod
    def of_driver(cls, root: Path | None = None) -> HandoffDirectory | None:
        """The directory on this (the driver's) machine, its token made if missing.

        :param root: where (default: :func:`default_root`).
        :returns: ``None`` when the directory cannot be made or read (a read-only or full
            temporary directory), or is not this user's alone: every task then sends its
            batches in messages, slower, and a warning says why.
        """
        root = root or default_root()
        token_file = root / _TOKEN_FILE
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _private(root):
                _warn_unused(root, "another user owns it, others may read it, or it is a link")
                return None
            if not token_file.exists():
                _make_token(token_file)
            return cls(str(root), token_file.read_text())
        except OSError as error:
            _warn_unused(root, str(error))
            return None

    def reachable(self) -> bool:
        """Whether this process sees the driver's directory: its token file, unchanged."""
        try:
            return (Path(self.root) / _TOKEN_FILE).read_text() == self.token
        except OSError:
            return False

    def task_file(self, query_id: str, batch_id: int, task: str) -> Path:
        """Where a task of micro-batch ``batch_id`` writes, its directory made.

        :param task: unique per attempt and per run (see ``LaminarStreamWriter``).
        """
        directory = self._query(query_id) / f"batch-{batch_id}"
        directory.mkdir(parents=True, exist_ok=True)
        return directory / f"{task}.arrow"

    def discard(self, query_id: str, batch_id: int) -> None:
        """Remove the files of micro-batch ``batch_id`` and of every earlier one of the query.

        Best effort: a file left behind is only disk space, and the next commit tries again.
        """
        query = self._query(query_id)
        with contextlib.suppress(OSError):
            for directory in query.iterdir():
                found = _BATCH.fullmatch(directory.name)
                if found and int(found[1]) <= batch_id:
                    shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):  # empty: the query's last micro-batch is done
            query.rmdir()

    def _query(self, query_id: str) -> Path:
        # Spark's query ids are UUIDs; anything else must not name a path outside the root.
        return Path(self.root) / f"query-{re.sub(r'[^0-9A-Za-z-]', '_', query_id)}"


def _private(directory: Path) -> bool:
    """Whether ``directory`` is this user's, and no one else may read or enter it (POSIX)."""
    uid = _uid()
    if uid is None:
        return True
    status = directory.lstat()
    return stat.S_ISDIR(status.st_mode) and status.st_uid == uid and not status.st_mode & 0o077


def _warn_unused(root: Path, reason: str) -> None:
    logger.warning(
        "the Spark bridge cannot hand batches over in %s (%s): tasks send them to the commit "
        "in messages, which is slower; remove that directory, or point TMPDIR at a directory "
        "of your own",
        root,
        reason,
    )


def _make_token(token_file: Path) -> None:
    """Write a new token, unless another driver process wrote one first (theirs stays)."""
    staged = token_file.with_name(f".{_TOKEN_FILE}-{secrets.token_hex(8)}")
    staged.write_text(secrets.token_hex(16))
    try:
        os.link(staged, token_file)  # fails when the token exists: never two tokens
    except FileExistsError:
        pass
    finally:
        staged.unlink()
