"""The archive of Spark's classes that drivers map to start sooner: whole, once, or not at all."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pyspark.find_spark_home import _find_spark_home

from laminar_sdk._spark import class_archive
from laminar_sdk._spark.class_archive import (
    ARCHIVE_VARIABLE,
    ClassArchive,
    driver_archive_option,
    installation_key,
)
from laminar_sdk._spark.temporary_files import spark_temporary_files_in


@pytest.fixture
def spark_home(tmp_path: Path) -> Path:
    """A Spark installation's shape: its jars."""
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-core.jar").write_bytes(b"1")
    return home


@pytest.fixture
def archive(tmp_path: Path, spark_home: Path) -> ClassArchive:
    directory = tmp_path / "archives"
    directory.mkdir()
    return ClassArchive(directory, spark_home)


def test_only_an_archive_of_the_size_its_name_says_is_mapped(archive: ClassArchive) -> None:
    whole = archive.directory / f"{archive.key}-100.jsa"
    whole.write_bytes(b"x" * 100)
    assert archive.usable() == whole
    whole.unlink()
    cut_short = archive.directory / f"{archive.key}-200.jsa"
    cut_short.write_bytes(b"x" * 50)  # the JVM dies of SIGBUS on such a file
    assert archive.usable() is None
    assert not cut_short.exists(), "a file that is not whole is removed"


def test_one_process_trains_at_a_time_and_a_dead_ones_lock_is_taken_over(
    archive: ClassArchive,
) -> None:
    lock = archive.directory / f"{archive.key}.training"
    lock.write_text(f"{os.getpid()}\n")  # a live trainer
    assert not archive.may_train()
    assert archive._claim() is None
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                              capture_output=True, text=True)  # fmt: skip
    lock.write_text(finished.stdout)  # a trainer killed before it removed its lock
    assert archive.may_train()
    left = archive.directory / f"{archive.key}.4242.partial"
    left.write_bytes(b"half an archive")
    written = archive._claim()
    assert written == archive.directory / f"{archive.key}.{os.getpid()}.partial"
    assert lock.read_text() == f"{os.getpid()}\n"
    assert not left.exists(), "what a dead trainer's JVM wrote is removed"


def test_a_failed_training_says_why_and_is_not_tried_again_for_a_day(
    archive: ClassArchive, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with caplog.at_level(logging.WARNING, logger="laminar_sdk.spark"):
        assert archive.train() is None
    assert "Spark's classes were not archived (drivers start as usual" in caplog.text
    assert "the training driver exited with 1" in caplog.text
    assert not (archive.directory / f"{archive.key}.training").exists(), "the lock is released"
    assert not archive.may_train()
    # A training that would succeed is not even started within the day.
    trainer = archive.directory / "trainer"
    trainer.write_text('#!/bin/sh\ntouch "$(dirname "$0")/started"\n')
    trainer.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(trainer))
    assert archive.train() is None
    assert not (archive.directory / "started").exists()


def test_a_training_out_of_time_is_tried_again_by_the_next_driver(
    archive: ClassArchive, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    slow = archive.directory / "slow-trainer"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow))
    monkeypatch.setattr(class_archive, "TRAINING_TIMEOUT_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="laminar_sdk.spark"):
        assert archive.train() is None
    assert "Spark's classes were not archived within 0.5 s; drivers start as usual" in caplog.text
    assert archive.may_train(), "a busy machine is no reason to wait a day"


def test_the_callers_own_class_sharing_options_or_off_turn_it_off(
    archive: ClassArchive, spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ARCHIVE_VARIABLE, str(archive.directory))
    whole = archive.directory / f"{archive.key}-3.jsa"
    whole.write_bytes(b"abc")
    assert driver_archive_option(spark_home, "-XX:TieredStopAtLevel=1") == (
        f'-XX:SharedArchiveFile="{whole}" {class_archive.QUIET}'
    )
    assert driver_archive_option(spark_home, "-Xshare:off") is None
    assert driver_archive_option(spark_home, "-XX:SharedArchiveFile=/mine.jsa") is None
    monkeypatch.setenv(ARCHIVE_VARIABLE, "off")
    assert driver_archive_option(spark_home, "") is None


def test_a_training_that_cannot_start_leaves_the_driver_to_start_as_usual(
    archive: ClassArchive,
    spark_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def no_shell(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", "/bin/sh")

    monkeypatch.setenv(ARCHIVE_VARIABLE, str(archive.directory))
    monkeypatch.setattr(class_archive.subprocess, "run", no_shell)
    with caplog.at_level(logging.WARNING, logger="laminar_sdk.spark"):
        assert driver_archive_option(spark_home, "") is None
    assert "Spark's classes are not archived (drivers start as usual): " in caplog.text


def test_the_archives_of_removed_installations_are_removed_by_the_next_training(
    tmp_path: Path, archive: ClassArchive
) -> None:
    removed = tmp_path / "deleted-virtualenv"
    java = shutil.which("java") if "JAVA_HOME" not in os.environ else None
    java = Path(java or Path(os.environ["JAVA_HOME"], "bin", "java")).resolve()
    (archive.directory / "gone.home").write_text(f"{removed}\n")
    (archive.directory / "gone-3.jsa").write_bytes(b"abc")
    (archive.directory / "gone.failed").write_text("its training failed as it was deleted")
    # The same home and Java under another key: reinstalled in place, its jars changed (as an
    # older SDK recorded it too, without the Java). CI's fresh clones left 28 of these, 4.7 GB.
    records = {"replaced": [archive.spark_home, java], "old": [archive.spark_home]}
    for replaced, named in records.items():
        (archive.directory / f"{replaced}.home").write_text("".join(f"{n}\n" for n in named))
        (archive.directory / f"{replaced}-3.jsa").write_bytes(b"abc")
    (archive.directory / "other-java.home").write_text(f"{archive.spark_home}\n/opt/jdk21/java\n")
    (archive.directory / "other-java-3.jsa").write_bytes(b"abc")
    assert archive._claim() is not None
    assert sorted(path.name for path in archive.directory.iterdir()) == sorted(
        [f"{archive.key}.home", f"{archive.key}.training", "other-java-3.jsa", "other-java.home"]
    )
    assert (archive.directory / f"{archive.key}.home").read_text().splitlines() == [
        str(archive.spark_home),
        str(java),
    ]


def test_another_spark_installation_gets_another_archive(spark_home: Path) -> None:
    before = installation_key(spark_home)
    assert installation_key(spark_home) == before
    (spark_home / "jars" / "spark-sql.jar").write_bytes(b"2")
    assert installation_key(spark_home) != before


MAPPED_ARCHIVES = textwrap.dedent(
    """
    import os
    from pyspark import SparkContext
    from laminar_sdk.spark import build_session

    spark = build_session()
    assert spark.range(10).count() == 10
    ours = os.environ["LAMINAR_SPARK_CLASS_ARCHIVE"]
    with open(f"/proc/{SparkContext._gateway.proc.pid}/maps") as maps:
        print("mapped:", sorted({line.split()[-1] for line in maps if ours in line}))
    """
)
"""A child that starts a driver with build_session, and prints which of laminar's class
archives it maps (the JDK's own archive is mapped by every JVM)."""


@pytest.mark.spark
def test_the_command_makes_the_archive_that_the_next_driver_maps() -> None:
    # This installation's archive, where every driver finds it (CI's tox made it already).
    environment = {**os.environ}
    environment.pop(ARCHIVE_VARIABLE, None)
    made = subprocess.run(
        [sys.executable, "-m", "laminar_sdk", "spark-archive"], capture_output=True, text=True,
        env=environment, timeout=600, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    archive = made.stdout.splitlines()[-1].removeprefix("laminar: Spark's class archive: ")
    driver = subprocess.run(
        [sys.executable, "-c", MAPPED_ARCHIVES], capture_output=True, text=True,
        env={**environment, ARCHIVE_VARIABLE: str(Path(archive).parent)}, timeout=300,
        check=False,
    )  # fmt: skip
    assert driver.returncode == 0, driver.stderr[-3000:]
    assert f"mapped: ['{archive}']" in driver.stdout, driver.stdout


@pytest.mark.spark
@pytest.mark.full  # nightly: a training from nothing takes a core for 30 s
def test_a_driver_trains_the_archive_in_the_background_and_the_next_maps_it(
    tmp_path: Path,
) -> None:
    # In children: this process's driver may be running already.
    archives = tmp_path / "archives"
    callers_temporary = tmp_path / "callers-tmp"
    callers_temporary.mkdir()

    def driver(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
        environment = {**environment, ARCHIVE_VARIABLE: str(archives)}
        return subprocess.run(
            [sys.executable, "-c", MAPPED_ARCHIVES], capture_output=True, text=True,
            env=environment, timeout=300, check=False,
        )  # fmt: skip

    first = driver(spark_temporary_files_in(callers_temporary))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "mapped: []" in first.stdout, "the first driver does not wait for the training"
    # The training outlives its caller, and its caller's temporary directory (as the kit's
    # Spark layer removes each run's).
    shutil.rmtree(callers_temporary)
    deadline = time.monotonic() + class_archive.TRAINING_TIMEOUT_S
    while list(archives.glob("*.training")) and time.monotonic() < deadline:
        time.sleep(1)
    made = list(archives.glob("*.jsa"))
    assert len(made) == 1, [(path.name, path.read_text()) for path in archives.glob("*.failed")]
    assert made[0].name.endswith(f"-{made[0].stat().st_size}.jsa")
    assert sorted(path.suffix for path in archives.iterdir()) == [".home", ".jsa"], "no leftovers"

    second = driver(dict(os.environ))
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"mapped: ['{made[0]}']" in second.stdout, second.stdout
    assert "Skipping" not in second.stdout + second.stderr, "the JVM's class-sharing log is off"


def laminar_spark_archive(directory: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, ARCHIVE_VARIABLE: directory}
    return subprocess.run(
        [sys.executable, "-m", "laminar_sdk", "spark-archive", *arguments],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip


def test_the_command_prints_the_archive_or_why_there_is_none(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path, Path(_find_spark_home()))
    whole = tmp_path / f"{archive.key}-3.jsa"
    whole.write_bytes(b"abc")
    made = laminar_spark_archive(str(tmp_path))
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"laminar: Spark's class archive: {whole}\n"
    whole.unlink()
    (tmp_path / f"{archive.key}.failed").write_text("the training driver exited with 1: no Java")
    failed = laminar_spark_archive(str(tmp_path))
    assert failed.returncode == 1
    assert "Spark's classes are not archived: the training driver exited with 1: no Java" in (
        failed.stderr
    )
    assert f"delete {tmp_path / f'{archive.key}.failed'} to try again" in failed.stdout
    off = laminar_spark_archive("off", "--start")
    assert off.returncode == 0
    assert off.stdout == f"laminar: {ARCHIVE_VARIABLE}=off: Spark's classes are not archived\n"
