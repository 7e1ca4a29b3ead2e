"""An archive of the classes Spark's driver JVM loads, mapped by every driver laminar starts.

A Spark driver spends most of its start-up loading and verifying classes: on an idle two-core
machine a short local query took 12 CPU-seconds and 10.7 s from a cold JVM, and 6.7
CPU-seconds and 5.5 s with the classes mapped from an archive (JDK class data sharing,
``-XX:SharedArchiveFile``). :func:`~laminar_sdk.spark.build_session` adds that option
whenever it starts a driver:

- when the archive of this Java and this Spark exists, the driver maps it;
- otherwise it starts a training in the background, at the lowest priority, and this driver
  starts without: a short training driver (a batch and a streaming query, about 30 s of one
  core, once per installation) writes the archive as its JVM exits. One process at a time
  trains (a lock file); a training that failed is not tried again for a day. ``laminar
  spark-archive`` (:func:`prepare`) trains in the foreground, and prints where the archive
  is: CI runs it before its tests.

The JVM crashes (SIGBUS) on an archive cut short, so an archive only ever appears whole: it is
written under a temporary name, renamed once its JVM exited cleanly, and its size is part of
its name; a file of another size is removed, not mapped. An archive of another Java build or
classpath is checked by the JVM and ignored (the driver starts as without one).

The archives live in ``$LAMINAR_SPARK_CLASS_ARCHIVE`` when it names a directory, else in
``$XDG_CACHE_HOME/laminar/spark-class-archive`` (``~/.cache/...``), one per Java and Spark
installation (about 165 MB; those of removed installations are removed when another trains).
``LAMINAR_SPARK_CLASS_ARCHIVE=off`` turns it off, and so does a
JVM option about class sharing of the caller's own (``-Xshare``, ``SharedArchiveFile``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from laminar_sdk._spark.temporary_files import spark_temporary_files_in

logger = logging.getLogger("laminar_sdk.spark")

ARCHIVE_VARIABLE = "LAMINAR_SPARK_CLASS_ARCHIVE"
"""``off`` to start Spark drivers without a class archive, or the directory to keep it in."""

OFF = "off"

MODULE = "laminar_sdk._spark.class_archive"
"""This module's name, also when it runs as ``__main__`` (the training runs it again)."""

CALLERS_SHARING_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
"""JVM options that mean the caller manages class sharing: laminar then adds none."""

QUIET = "-Xlog:cds*=off"
"""The JVM otherwise prints a line for each class it cannot archive, on the driver's output."""

STALE_AFTER_S = 15 * 60.0
"""A build lock older than this was left by a process that died, even if its pid is in use."""

TRAINING_TIMEOUT_S = 300.0
"""The longest a training driver may take; it is stopped then, no archive is made, and the next
driver to start tries again."""

RETRY_AFTER_S = 24 * 3600.0
"""How long a failed training keeps the next ones from running."""


def archive_directory() -> Path | None:
    """Where the archives live, or ``None`` when ``$LAMINAR_SPARK_CLASS_ARCHIVE`` is ``off``."""
    configured = os.environ.get(ARCHIVE_VARIABLE, "").strip()
    if configured.lower() == OFF:
        return None
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "laminar" / "spark-class-archive"


def installation_key(spark_home: Path) -> str:
    """A name for this Java and this Spark installation.

    An archive fits only the JVM and the classpath it was made with (the JVM checks the jars'
    paths, sizes and times), so an upgrade of either, or another virtualenv, gets a new one.
    Java is found as Spark's launcher finds it (``$JAVA_HOME/bin/java``, else ``java`` on the
    ``PATH``).
    """
    digest = hashlib.sha256()
    for path in (_java(), *sorted((spark_home / "jars").glob("*.jar"))):
        resolved = path.resolve()
        with contextlib.suppress(OSError):
            stat = resolved.stat()
            digest.update(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _java() -> Path:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    return Path(java_home, "bin", "java") if java_home else Path(shutil.which("java") or "java")


@dataclass(frozen=True)
class ClassArchive:
    """The class archive of one Java and Spark installation, in ``directory``.

    :param directory: where the archives live.
    :param spark_home: the Spark installation (``pyspark``'s directory when pip-installed).
    """

    directory: Path
    spark_home: Path

    @functools.cached_property
    def key(self) -> str:
        """The installation's :func:`installation_key`."""
        return installation_key(self.spark_home)

    def usable(self) -> Path | None:
        """The archive, whole, if it exists; one whose size is not its name's is removed."""
        for path in self.directory.glob(f"{self.key}-*.jsa"):
            expected = path.stem.removeprefix(f"{self.key}-")
            try:
                if expected.isdigit() and path.stat().st_size == int(expected):
                    return path
            except FileNotFoundError:
                continue
            logger.warning("removing the Spark class archive %s: it is not whole", path)
            path.unlink(missing_ok=True)
        return None

    def may_train(self) -> bool:
        """Whether no process trains now, and no training failed within :data:`RETRY_AFTER_S`."""
        return _age_s(self.failed_marker()) >= RETRY_AFTER_S and not self.training_elsewhere()

    def last_failure(self) -> str | None:
        """Why the last training failed, if it did within :data:`RETRY_AFTER_S`."""
        if _age_s(self.failed_marker()) >= RETRY_AFTER_S:
            return None
        with contextlib.suppress(OSError):
            return self.failed_marker().read_text().strip()
        return None

    def training_elsewhere(self) -> bool:
        """Whether a live process is training the archive."""
        return self._lock().exists() and not _stale(self._lock())

    def wait_for_training(self) -> Path | None:
        """Wait for the training running elsewhere to end: the archive it made, or ``None``.

        Waits :data:`TRAINING_TIMEOUT_S` at most.
        """
        deadline = time.monotonic() + TRAINING_TIMEOUT_S
        while self.training_elsewhere() and time.monotonic() < deadline:
            time.sleep(0.5)
        return self.usable()

    def train_in_background(self) -> None:
        """Start a training at low priority, detached: this process goes on without waiting."""
        command = [sys.executable, "-m", MODULE, "--train", str(self.spark_home)]
        environment = {**os.environ, ARCHIVE_VARIABLE: str(self.directory)}
        logger.info(
            "archiving Spark's classes in %s in the background, once per Java and Spark "
            "installation: drivers started after that start in about half the CPU time "
            "(%s=off turns this off)",
            self.directory,
            ARCHIVE_VARIABLE,
        )
        # A shell starts it in the background and returns at once: the training is nobody's
        # child here, so it is never reaped late (a zombie) nor collected running (Python's
        # ResourceWarning), and it outlives this process.
        detach = 'nice -n 19 "$@" < /dev/null > /dev/null 2>&1 &'
        shell = ["/bin/sh", "-c", detach, "sh", *command]
        subprocess.run(shell, env=environment, check=True, start_new_session=True)

    def train(self) -> Path | None:
        """Run a training driver that writes the archive, and wait: the archive, or ``None``.

        ``None`` at once when another live process is training, or when a training failed
        less than :data:`RETRY_AFTER_S` ago (one that ran out of time did not fail: the next
        driver tries again).
        """
        if _age_s(self.failed_marker()) < RETRY_AFTER_S:
            return None
        written = self._claim()
        if written is None:
            return None
        command = [sys.executable, "-m", MODULE, "--write", str(written)]
        # Its own temporary directory: the caller's may be a run's, removed while this runs
        # in the background (the kit's Spark layer gives each pipeline run one).
        scratch = written.with_suffix(".tmp")
        scratch.mkdir()
        environment = spark_temporary_files_in(scratch)
        try:
            trained = subprocess.run(
                command, capture_output=True, text=True, timeout=TRAINING_TIMEOUT_S,
                check=False, env=environment, cwd=scratch,
            )  # fmt: skip
            if trained.returncode != 0 or not written.is_file():
                output = (trained.stdout + trained.stderr)[-2000:]
                raise OSError(f"the training driver exited with {trained.returncode}: {output}")
            archive = self.directory / f"{self.key}-{written.stat().st_size}.jsa"
            os.replace(written, archive)
        except subprocess.TimeoutExpired:
            # A busy machine, most likely (the background training yields to everything):
            # the next driver tries again. What the JVM writes as it exits is removed then.
            logger.warning(
                "Spark's classes were not archived within %g s; drivers start as usual",
                TRAINING_TIMEOUT_S,
            )
            return None
        except OSError as error:
            logger.warning(
                "Spark's classes were not archived (drivers start as usual; the next try is in "
                "a day, or delete %s): %s",
                self.failed_marker(),
                error,
            )
            self.failed_marker().write_text(f"{error}\n")
            written.unlink(missing_ok=True)
            return None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            self._lock().unlink(missing_ok=True)
        return archive

    def _claim(self) -> Path | None:
        """Become the one process that trains: the path its JVM writes the archive to."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock = self._lock()
            if _stale(lock):
                lock.unlink(missing_ok=True)
            descriptor = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            return None
        with os.fdopen(descriptor, "w") as file:
            file.write(f"{os.getpid()}\n")
        for left in self.directory.glob(f"{self.key}.*.partial"):
            left.unlink(missing_ok=True)  # a training whose process died; we hold the lock
        for left in self.directory.glob(f"{self.key}.*.tmp"):
            shutil.rmtree(left, ignore_errors=True)
        installation = f"{self.spark_home}\n{_java().resolve()}\n"
        _remove_files_of_gone_installations(self.directory, self.key, installation)
        (self.directory / f"{self.key}.home").write_text(installation)
        return self.directory / f"{self.key}.{os.getpid()}.partial"

    def _lock(self) -> Path:
        return self.directory / f"{self.key}.training"

    def failed_marker(self) -> Path:
        """The file that records why the last training failed."""
        return self.directory / f"{self.key}.failed"


def _remove_files_of_gone_installations(directory: Path, key: str, installation: str) -> None:
    """Remove the archives (and the rest) of Spark installations that are gone.

    Each key's ``KEY.home`` names its installation: the Spark home, and the Java (a record of
    an older SDK names the home only). Gone: a home that is no longer there (a deleted
    virtualenv); or, under another key than ``key`` (the one about to be trained), the same
    home with the same Java as ``installation``: its jars changed since (reinstalled in place,
    as a fresh checkout's tox environment is), so its archive can never be used again. Another
    Java's archive of the same home is kept.
    """
    home, java = installation.splitlines()
    for record in directory.glob("*.home"):
        if record.stem == key:
            continue
        with contextlib.suppress(OSError):
            named = record.read_text().splitlines()
            replaced = named[:1] == [home] and named[1:2] in ([java], [])
            if replaced or not Path(named[0] if named else "").is_dir():
                for left in directory.glob(f"{record.stem}[-.]*"):
                    if left.is_dir():
                        shutil.rmtree(left)
                    elif left != record:
                        left.unlink()
                record.unlink()


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


def _stale(lock: Path) -> bool:
    """Whether ``lock`` was left by a process that is gone (killed before it could remove it)."""
    try:
        text = lock.read_text().strip()
    except FileNotFoundError:
        return False
    if not text.isdigit():
        return _age_s(lock) > STALE_AFTER_S  # being written, or garbage once old
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    return _age_s(lock) > STALE_AFTER_S


def driver_archive_option(spark_home: Path, java_options: str) -> str | None:
    """The JVM options that map the class archive into a driver about to start, or ``None``.

    Without an archive, starts its training in the background (see the module's
    documentation) and returns ``None``: this driver starts without.

    :param java_options: the JVM options the driver gets already (the caller's): one about
        class sharing means the caller manages it.
    """
    directory = archive_directory()
    if directory is None or any(option in java_options for option in CALLERS_SHARING_OPTIONS):
        return None
    archive = ClassArchive(directory, spark_home)
    usable = archive.usable() if directory.is_dir() else None
    if usable is not None:
        return f'-XX:SharedArchiveFile="{usable}" {QUIET}'
    if archive.may_train():
        try:
            archive.train_in_background()
        except (OSError, subprocess.CalledProcessError) as error:
            logger.warning("Spark's classes are not archived (drivers start as usual): %s", error)
    return None


def _train(written: Path) -> None:
    """The training driver: a batch and a streaming query, then the JVM exits and writes."""
    # Imported here: session imports this module, and the training alone needs these.
    from pyspark import SparkContext  # noqa: PLC0415

    from laminar_sdk._spark.session import DRIVER_JAVA_OPTIONS, build_session  # noqa: PLC0415

    # An option about class sharing of the caller's own: build_session adds none of its own.
    options = f'-XX:ArchiveClassesAtExit="{written}" {QUIET}'
    spark = build_session(**{DRIVER_JAVA_OPTIONS: options})
    spark.range(1000).selectExpr("sum(id)").collect()
    stream = spark.readStream.format("laminar").option("connector", "generator")
    query = (
        stream.option("rows", "10")
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]  # set by launch_gateway
    spark.stop()
    jvm.stdin.close()  # the gateway exits on its closed input, and writes the archive
    if jvm.wait(timeout=TRAINING_TIMEOUT_S) != 0:
        raise SystemExit(f"the training driver's JVM exited with {jvm.returncode}")


def prepare(*, start: bool = False) -> int:
    """``laminar spark-archive``: make this installation's archive, and say where it is.

    Makes it unless it exists, waiting for a training that runs already; CI runs it before its
    tests, so that every driver they start maps it. With ``start``, starts that training in
    the background and returns at once (CI starts it before its type check, which leaves a
    core idle). The exit status is 1 when no archive could be made.
    """
    directory = archive_directory()
    if directory is None:
        print(f"laminar: {ARCHIVE_VARIABLE}=off: Spark's classes are not archived")
        return 0
    from pyspark.find_spark_home import _find_spark_home  # noqa: PLC0415 - pyspark only here

    archive = ClassArchive(directory, Path(_find_spark_home()))
    usable = archive.usable() if directory.is_dir() else None
    if start:
        if usable is None and archive.may_train():
            archive.train_in_background()
        print(f"laminar: Spark's class archive: {usable or 'training in the background'}")
        return 0
    if usable is None and archive.training_elsewhere():
        print(f"laminar: waiting for the training of Spark's class archive in {directory}")
        usable = archive.wait_for_training()
    if usable is None and archive.last_failure() is None:
        print(f"laminar: archiving Spark's classes in {directory} (about 30 s, once)", flush=True)
        usable = archive.train()
    if usable is None:
        failure = archive.last_failure() or "see the warning above"
        print(f"laminar: Spark's classes are not archived: {failure}", file=sys.stderr)
        print(f"laminar: delete {archive.failed_marker()} to try again")
        return 1
    print(f"laminar: Spark's class archive: {usable}")
    return 0


def main(arguments: list[str]) -> int:
    """``python -m laminar_sdk._spark.class_archive``: a training, started by this module.

    ``--train SPARK_HOME`` is the background training (started at the lowest priority), and
    ``--write PATH`` its training driver.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    job = parser.add_mutually_exclusive_group(required=True)
    job.add_argument("--train", type=Path, metavar="SPARK_HOME")
    job.add_argument("--write", type=Path, metavar="PATH")
    options = parser.parse_args(arguments)
    directory = archive_directory()
    if options.write is not None:
        _train(options.write)
    elif directory is not None:
        ClassArchive(directory, options.train).train()
    return 0


if __name__ == "__main__":
    logging.basicConfig(format="%(message)s")
    raise SystemExit(main(sys.argv[1:]))
