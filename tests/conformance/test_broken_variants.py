"""The kit catches each deliberately broken variant of the reference connectors.

Every variant in ``broken.py`` runs through ``python -m laminar_conformance run`` (the command
``laminar conformance run`` wraps) with a fixed seed, as a plugin author's CI would run it, with
the in-process layer only (``--no-spark``: the variants' bugs are in-process bugs), limited with
``--check`` to the checks expected to catch it: the run must fail, and its report must name the
check that caught the bug. The correct connectors' runs must pass the checks of what they
offer rather than skip them.

The ``outsider-*`` connectors (``outsider.py``) are a third-party plugin written as an outside
author would, with test contexts that declare nothing (no ``partitions``, no ``live_appends``):
the kit must find the source's partitions and live appends by probing, and catch each bug with
the quick profile; the correct source and sinks pass the checks the tests read with seed 1 (in
``tox -e full``: whole runs with seeds 1, 2 and 3, and the checks that catch the variants).
``outsider_network.py``'s PostgreSQL sinks on pg8000 and HTTP sources on urllib run the
network-fault checks through Toxiproxy: the ones without a network timeout hang on a
blackholed connection.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from laminar_conformance._network import NETWORK_FAULTS
from laminar_conformance.sink import STALE_SCHEDULES

HERE = Path(__file__).parent

# Variant, role, and a check that must catch it (others may too).
VARIANTS = [
    ("broken-commit-in-pre-commit", "sink", "test_nothing_is_visible_before_commit_epoch"),
    ("broken-rollback-keeps-buffer", "sink", "test_a_rolled_back_epoch_leaves_no_trace"),
    ("broken-loses-last-batch", "sink", "test_epoch_protocol_state_machine"),
    (
        "broken-forgets-committed-epochs",
        "sink",
        "test_a_committed_epoch_delivered_again_after_a_restart_is_skipped",
    ),
    (
        "broken-commit-state-in-memory",
        "sink",
        "test_an_epoch_decided_before_a_crash_is_committed_by_a_new_instance",
    ),
    ("broken-writes-straight-through", "sink", "test_close_abandons_an_open_epoch"),
    (
        "broken-restore-off-by-one",
        "source",
        "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
    ),
    (
        "broken-checkpoint-ahead",
        "source",
        "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
    ),
    ("broken-restore-ignores-a-partition", "source", "test_each_partition_restores_independently"),
    (
        "broken-schema-drift",
        "source",
        "test_every_record_is_returned_once_in_batches_of_the_schema",
    ),
    (
        "broken-range-read-off-by-one",
        "source",
        "test_range_reads_return_exactly_what_polling_returned",
    ),
    ("broken-plan-end-ahead", "source", "test_plan_end_names_only_records_already_appended"),
    ("broken-publishes-every-attempt", "sink", "test_only_the_named_attempts_are_published"),
    (
        "broken-commit-aggregated-not-idempotent",
        "sink",
        "test_commit_aggregated_again_after_a_restart_adds_nothing",
    ),
    (
        "broken-staged-visible-before-commit",
        "sink",
        "test_nothing_staged_is_visible_before_commit_aggregated",
    ),
    ("broken-evolution-not-applied", "sink", "test_schema_evolution_adds_a_column_between_epochs"),
]
# Third-party-style variants (outsider.py), the default context: caught only if probed.
STALE = "test_a_stale_instance_that_keeps_going_changes_nothing"
OUTSIDER_VARIANTS = [
    ("outsider-sqlite-commits-what-is-left", "sink", STALE),
    (
        "outsider-jsonl-logs-its-configuration",
        "sink",
        "test_health_and_metrics_are_sane",
    ),
    (
        "outsider-restores-first-partition-only",
        "source",
        "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
    ),
    (
        "outsider-checkpoint-lags-in-one-partition",
        "source",
        "test_each_partition_restores_independently",
    ),
    (
        "outsider-checkpoints-the-end-when-caught-up",
        "source",
        "test_records_appended_while_reading_are_returned_once_across_restores",
    ),
    (
        "outsider-advances-the-next-partition",
        "source",
        "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
    ),
    (
        "outsider-lists-its-partitions-when-it-opens",
        "source",
        "test_a_partition_that_appears_while_reading_is_read_from_its_beginning",
    ),
    (
        "outsider-refuses-a-checkpoint-past-the-files",
        "source",
        "test_a_removed_partition_and_one_that_takes_its_place_stop_nothing",
    ),
    (
        "outsider-queue-blind-context",
        "source",
        "test_the_probe_reaches_every_partition_the_source_checkpoints",
    ),
    (
        "outsider-sqlite-marker-apart",
        "sink",
        "test_delivery_survives_a_crash_at_each_point_inside_a_call",
    ),
    (
        "outsider-outbox-archives-apart",
        "source",
        "test_delivery_survives_a_crash_at_each_point_inside_a_call",
    ),
    (
        "outsider-jsonl-buffered-pre-commit",
        "sink",
        "test_delivery_survives_a_real_kill_after_each_durable_call",
    ),
    # What the Spark bridge would refuse or break on, caught in process first.
    (
        "outsider-stamps-in-nanoseconds",
        "source",
        "test_batches_reach_spark_as_the_source_declares_them",
    ),
    (
        "outsider-infers-its-schema-from-the-data",
        "source",
        "test_schema_is_known_when_opened_and_the_same_on_every_instance",
    ),
    (
        "outsider-acknowledges-on-receipt",
        "source",
        "test_a_source_reopened_and_restored_for_each_micro_batch_loses_nothing",
    ),
    (
        "outsider-jsonl-unsigned-ids",
        "sink",
        "test_the_sink_schema_comes_back_from_spark_unchanged",
    ),
    (
        "outsider-plans-from-the-lines-seen-at-open",
        "source",
        "test_an_instance_kept_open_plans_records_appended_after_it_opened",
    ),
]
# Exactly-once sinks on stores the kit was never tuned to (outsider_stores.py), each committing
# its rows and its epoch record in two transactions: caught with the default context, no marks.
# Their correct twins pass the check: in CI the one whose calls no profiler reports (ctypes) with
# seed 1; in `tox -e full` every one with seeds 1, 2 and 3 (each twin's run is 30 to 70 s).
STORES = ["sqlite-sql", "sqlite-thread", "duckdb", "lmdb", "psycopg", "journal"]
STORES_IN_CI = {"journal"}
STORE_TWINS = [
    pytest.param(
        store, seed, marks=() if store in STORES_IN_CI and seed == "1" else pytest.mark.full
    )
    for store in STORES
    for seed in ("1", "2", "3")
]
INSIDE_A_CALL = "test_delivery_survives_a_crash_at_each_point_inside_a_call"
STORE_VARIANTS = [(f"outsider-{store}-marker-apart", "sink", INSIDE_A_CALL) for store in STORES]
# A PostgreSQL sink written with pg8000 and no network timeout (outsider_network.py): its calls
# hang on a blackholed connection. Its twin, with pg8000's socket timeout, passes every fault.
NETWORK = "test_a_network_fault_ends_calls_cleanly_and_loses_nothing"
SOURCE_NETWORK = "test_a_network_fault_ends_polls_and_loses_nothing"
# An HTTP event-API source on urllib without a timeout (outsider_network.py) hangs the same way;
# its twin, with one, passes. The variants run the blackhole case only (the one that hangs
# them; the other cases pass).
NETWORK_VARIANTS = [
    ("outsider-pg8000-without-a-timeout", "sink", f"{NETWORK}[blackhole]"),
    ("outsider-http-without-a-timeout", "source", f"{SOURCE_NETWORK}[blackhole]"),
]
NETWORK_TWINS = {"outsider-pg8000": ("sink", NETWORK), "outsider-http": ("source", SOURCE_NETWORK)}
# The correct outsider connectors pass, with seed 1, the checks the tests below read (CI:
# `1:read`), and in `tox -e full` a whole run with seeds 1, 2 and 3 and the checks that catch
# their broken variants again with seeds 2 and 3 (`SEED:catching`). A whole run of each is the
# false-alarm guard of every check, which the first-party and reference connectors' own suites
# are in CI.
OUTSIDER_SEEDS = [
    "1:read",
    pytest.param("1", marks=pytest.mark.full),
    pytest.param("2:catching", marks=pytest.mark.full),
    pytest.param("3:catching", marks=pytest.mark.full),
    pytest.param("2", marks=pytest.mark.full),
    pytest.param("3", marks=pytest.mark.full),
]
KILLS = "test_delivery_survives_a_real_kill_after_each_durable_call"
OUTSIDER_READ = {
    "outsider-queue": (
        "test_the_probe_reaches_every_partition_the_source_checkpoints",
        "test_each_partition_restores_independently",
        "test_records_appended_while_reading_are_returned_once_across_restores",
        "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
    ),
    "outsider-sqlite": (KILLS, INSIDE_A_CALL, STALE),
    "outsider-jsonl": (KILLS, "test_health_and_metrics_are_sane"),
}
"""The checks the tests read from each correct outsider connector's run."""
OUTSIDER_CATCHING = {
    role: tuple(sorted({check for _, of, check in OUTSIDER_VARIANTS if of == role} | also))
    for role, also in (("source", {"test_each_partition_restores_independently"}), ("sink", set()))
}
"""The checks that catch the outsider variants of each role, and those the tests read."""
OUTSIDER_CORRECT = [
    ("outsider-queue", "source"),
    ("outsider-sqlite", "sink"),
    ("outsider-jsonl", "sink"),
]
# The state machine of the distributed commit must catch each distributed-commit bug too. CI
# runs it on the one whose failing case shrinks in seconds; shrinking the others' takes 50 to
# 150 s of a busy CI machine, so `tox -e full` runs them.
MACHINE_CATCHES = [
    pytest.param("broken-publishes-every-attempt", marks=pytest.mark.full),
    pytest.param("broken-commit-aggregated-not-idempotent", marks=pytest.mark.full),
    "broken-staged-visible-before-commit",
]
# Checks a test reads from a correct connector's run besides those it must pass.
ALSO_RUN = {"no-replay-source": ("test_each_partition_restores_independently",)}
# Correct connectors, and checks their runs must have passed (not skipped).
CORRECT = {
    ("buffering-sink", "sink"): ["test_epoch_protocol_state_machine"],
    ("no-replay-source", "source"): ["test_every_record_is_returned_once_in_batches_of_the_schema"],
    ("staging-sink", "sink"): [
        "test_distributed_commit_state_machine",
        "test_only_the_named_attempts_are_published",
        "test_staged_delivery_survives_any_faults",
        "test_schema_evolution_adds_a_column_between_epochs",
    ],
    ("range-readable-source", "source"): [
        "test_range_reads_return_exactly_what_polling_returned",
        "test_plan_end_names_only_records_already_appended",
        "test_records_appended_while_reading_are_returned_once_across_restores",
    ],
}


def conformance_run(
    connector: str,
    role: str,
    report: Path,
    *,
    plugin: str = "broken",
    seed: str = "1",
    checks: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "laminar_conformance", "run", connector, "--role", role]
    command += ["--plugin", plugin, "--seed", seed, "--no-spark", "--report", str(report)]
    command += ["--reruns", "0"]  # the labels are tested in test_conformance_cli.py
    for check in checks:
        command += ["--check", check]
    command += ["--html", str(report.with_suffix(".html"))]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    return subprocess.run(
        command, capture_output=True, text=True, env=environment, cwd=report.parent, check=False
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory, selected_params):
    """Every run, started at once on a pool as wide as the machine (each is one process).

    A broken variant's run is the quick profile with its default context, limited with
    ``--check`` to the checks the tests below expect to catch it (the checks are independent,
    and each runs the cases it would run in a whole run), and so is a correct reference-style
    connector's; a correct outsider connector's run is whole.
    """
    directory = tmp_path_factory.mktemp("broken")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        started: dict[str, Future] = {}

        def start(run: str, connector: str, role: str, **options) -> None:
            report = directory / f"{run}.md"
            started[run] = pool.submit(conformance_run, connector, role, report, **options)

        for connector, role, catching in VARIANTS:
            checks = [catching]
            if connector in selected_params("machine_caught"):
                checks.append("test_distributed_commit_state_machine")
            start(connector, connector, role, checks=tuple(checks))
        # The correct reference-style connectors run the checks the tests below read (the
        # whole-profile false-alarm guard is the outsider connectors' runs).
        for (connector, role), checks in CORRECT.items():
            start(connector, connector, role, checks=(*checks, *ALSO_RUN.get(connector, ())))
        for connector, role, catching in OUTSIDER_VARIANTS:
            start(connector, connector, role, plugin="outsider", checks=(catching,))
        for connector, role, catching in STORE_VARIANTS:
            start(connector, connector, role, plugin="outsider_stores", checks=(catching,))
        for connector, role, catching in NETWORK_VARIANTS:
            start(connector, connector, role, plugin="outsider_network", checks=(catching,))
        for twin, (role, check) in NETWORK_TWINS.items():
            start(twin, twin, role, plugin="outsider_network", checks=(check,))
        start(
            "outsider-outbox",
            "outsider-outbox",
            "source",
            plugin="outsider",
            checks=(INSIDE_A_CALL,),
        )
        for store, seed in sorted(selected_params("store", "store_seed")):
            connector = f"outsider-{store}"
            run = f"{connector}-{seed}"
            start(
                run, connector, "sink", plugin="outsider_stores", seed=seed, checks=(INSIDE_A_CALL,)
            )
        seeds = selected_params("seed") | {"1:read"}  # seed 1's runs serve other tests too
        for (connector, role), run in itertools.product(OUTSIDER_CORRECT, sorted(seeds)):
            seed, _, scope = run.partition(":")
            checks = {"": (), "read": OUTSIDER_READ[connector]}.get(scope, OUTSIDER_CATCHING[role])
            start(
                f"{connector}-{run}", connector, role, plugin="outsider", seed=seed, checks=checks
            )
        yield {run: (future.result(), directory / f"{run}.md") for run, future in started.items()}


def passing_report(runs, run: str) -> str:
    """The markdown report of ``run``, which must have passed."""
    result, report = runs[run]
    assert result.returncode == 0, result.stdout[-3000:]
    text = report.read_text()
    assert "**Result: PASSED**" in text
    return text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("connector", "role", "catching_check"),
    VARIANTS + OUTSIDER_VARIANTS + STORE_VARIANTS + NETWORK_VARIANTS,
)
def test_the_kit_catches_the_broken_variant(runs, connector, role, catching_check):
    result, report = runs[connector]
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    text = report.read_text()
    assert "**Result: FAILED**" in text
    failed = [line for line in text.splitlines() if "| failed |" in line]
    assert any(line.startswith(f"| {catching_check}") for line in failed), "\n".join(failed)
    assert f"laminar conformance run {connector} --role {role} --seed 1" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("seed", OUTSIDER_SEEDS)
@pytest.mark.parametrize("connector", ["outsider-sqlite", "outsider-jsonl"])
def test_the_correct_outsider_sinks_pass_every_check_including_real_kills(runs, connector, seed):
    text = passing_report(runs, f"{connector}-{seed}")
    for step in ("commit", "committed-manifest", "done"):
        check = f"test_delivery_survives_a_real_kill_after_each_durable_call[{step}]"
        assert f"| {check} | passed |" in text, f"{check} did not pass:\n{text}"
    if STALE in OUTSIDER_READ[connector] or seed != "1:read":
        for schedule in STALE_SCHEDULES:
            check = f"{STALE}[{schedule.name}]"
            assert f"| {check} | passed |" in text, f"{check} did not pass:\n{text}"


@pytest.mark.slow
@pytest.mark.parametrize(("connector", "role", "caught"), NETWORK_VARIANTS)
def test_a_connector_without_a_network_timeout_is_caught_hanging_on_a_silent_connection(
    runs, connector, role, caught
):
    text = runs[connector][1].read_text()
    assert f"| {caught} | failed |" in text, text
    assert "did not end within" in text
    assert "with no timeout" in text


@pytest.mark.slow
@pytest.mark.parametrize("twin", list(NETWORK_TWINS))
def test_the_correct_twins_end_their_calls_under_every_network_fault(runs, twin):
    text = passing_report(runs, twin)
    check = NETWORK_TWINS[twin][1]
    for fault in NETWORK_FAULTS:
        assert f"| {check}[{fault.name}] | passed |" in text, text


@pytest.mark.slow
def test_a_sink_whose_pre_commit_leaves_rows_in_a_buffer_loses_them_to_a_real_kill(runs):
    text = runs["outsider-jsonl-buffered-pre-commit"][1].read_text()
    assert (
        "3 epochs through the coordinator with faults [kill -9 at step commit of epoch 1]: not "
        "delivered exactly once: lost ids [3, 4, 5] (epochs [1])"
    ) in text
    # The killed process's calls are on the timeline: it died after pre_commit of epoch 1,
    # and a new instance committed what it had staged.
    page = runs["outsider-jsonl-buffered-pre-commit"][1].with_suffix(".html").read_text()
    assert "<title>instance 0: step commit of epoch 1: crash: kill -9</title>" in page
    assert "<title>instance 1: commit_epoch of epoch 1: ok</title>" in page


@pytest.mark.slow
@pytest.mark.parametrize("seed", OUTSIDER_SEEDS)
def test_the_correct_outsider_source_passes_with_probed_partitions_and_live_appends(runs, seed):
    text = passing_report(runs, f"outsider-queue-{seed}")
    probed = next(line for line in text.splitlines() if line.startswith("- Probed:"))
    assert "3 partition(s), probed" in probed
    assert "live appends: probed, records appended to an opened source arrive" in probed
    for check in (
        "test_each_partition_restores_independently",
        "test_records_appended_while_reading_are_returned_once_across_restores",
        "test_restoring_any_checkpoint_returns_exactly_the_records_after_it",
    ):
        assert f"| {check} | passed |" in text, f"{check} did not pass:\n{text}"


def _line_of(text: str, after: str) -> int:
    """The number of the first line of outsider.py that is ``text``, after the line ``after``."""
    lines = (HERE / "outsider.py").read_text().splitlines()
    start = lines.index(after)
    return next(n + 1 for n in range(start, len(lines)) if lines[n].strip() == text)


@pytest.mark.slow
def test_an_unmarked_sqlite_commit_inside_commit_epoch_is_found_and_crashed_at(runs):
    text = passing_report(runs, "outsider-sqlite-1:read")
    row = next(line for line in text.splitlines() if line.startswith(f"| {INSIDE_A_CALL} "))
    assert "| passed |" in row
    coverage = next(line for line in text.splitlines() if line.startswith("- Crash points"))
    assert "begin_epoch: no point (nothing it ran left Python)" in coverage
    # Before or after each of commit_epoch's statements and its commit, at least (the quick
    # profile's 20 crashes do not reach both sides of all 7 sites).
    crashed = re.search(
        r"commit_epoch: 7 site\(s\), 14 point\(s\), crashed at (\d+) in process", coverage
    )
    assert crashed, coverage
    assert 7 <= int(crashed[1]) <= 14, coverage
    broken = runs["outsider-sqlite-marker-apart"][1].read_text()
    publish = _line_of("db.commit()", "    def _publish(self, epoch: int) -> None:")
    rows_committed = f"db.commit() at outsider.py:{publish} in _publish"
    # Crashed after the rows' commit, in whichever epoch the run drew (1 to 3): the epoch is
    # published again by the next instance.
    caught = re.search(
        rf"\[crash-after inside commit_epoch: {re.escape(rows_committed)} of epoch (\d)\]: "
        r"not delivered exactly once: duplicated ids \[[\d, ]+\] \(epochs \[(\d)\]\)",
        broken,
    )
    assert caught, broken
    assert caught[1] == caught[2], "the ids doubled are the crashed epoch's"
    # The HTML report draws the failing case: the crash inside commit_epoch on the first
    # instance, the second instance committing the epoch again, and the ids doubled.
    page = runs["outsider-sqlite-marker-apart"][1].with_suffix(".html").read_text()
    epoch = caught[1]
    assert (
        f"<title>instance 0: commit_epoch of epoch {epoch}: crash-after inside commit_epoch: "
        f"{rows_committed}</title>"
    ) in page
    assert f"<title>instance 1: commit_epoch of epoch {epoch}: ok</title>" in page
    assert f"(epochs [{epoch}])</text>" in page


@pytest.mark.slow
@pytest.mark.parametrize(("store", "store_seed"), STORE_TWINS)
def test_the_correct_store_sinks_pass_every_crash_inside_their_calls(runs, store, store_seed):
    text = passing_report(runs, f"outsider-{store}-{store_seed}")
    row = next(line for line in text.splitlines() if line.startswith(f"| {INSIDE_A_CALL} "))
    assert "| passed |" in row, row
    coverage = next(line for line in text.splitlines() if line.startswith("- Crash points"))
    assert "commit_epoch:" in coverage
    assert "no point" not in coverage.partition("commit_epoch:")[2].partition(";")[0], coverage


@pytest.mark.slow
def test_a_sink_committing_on_a_thread_of_its_own_is_caught_by_a_real_kill_there(runs):
    text = runs["outsider-sqlite-thread-marker-apart"][1].read_text()
    assert "not delivered exactly once: duplicated ids [3, 4, 5]" in text
    assert "<- work:" in text  # the point is in the sink's writer thread
    coverage = next(line for line in text.splitlines() if line.startswith("- Crash points"))
    assert "crashed at 0 in process" in coverage, coverage


@pytest.mark.slow
def test_a_source_that_archives_what_it_read_in_two_transactions_is_caught_inside_poll(runs):
    copied = _line_of('db.execute("COMMIT")', "class OutboxSourceArchivesApart(OutboxSource):")
    broken = runs["outsider-outbox-archives-apart"][1].read_text()
    # Killed or crashed after the copy's commit and before the delete (the copy's COMMIT, the
    # delete's BEGIN, or the DELETE itself): the rows are both in the archive and in the
    # outbox, and the next instance reads them twice.
    caught = re.search(
        r"(crash-after|crash-before) inside poll_batch: db\.execute\(\) at outsider\.py:(\d+) "
        r"in archive <- poll_batch:\d+ of epoch \d\], then the rest: repeated or unknown ids \[\d",
        broken,
    )
    assert caught, broken
    side, number = caught[1], int(caught[2])
    between = {(copied, "crash-after"), (copied + 1, "crash-before"), (copied + 1, "crash-after")}
    assert (number, side) in between | {(copied + 2, "crash-before")}, caught[0]
    text = passing_report(runs, "outsider-outbox")
    coverage = next(line for line in text.splitlines() if line.startswith("- Crash points"))
    # Crashed in process and killed, both.
    assert re.search(
        r"poll_batch: \d+ site\(s\), \d+ point\(s\), crashed at [1-9]\d* in process "
        r"and [1-9]\d* killed",
        coverage,
    ), coverage
    assert "restore: no point (nothing it ran left Python)" in coverage


@pytest.mark.slow
def test_a_context_that_fills_one_partition_of_three_is_told_how_to_fix_it(runs):
    text = runs["outsider-queue-blind-context"][1].read_text()
    assert (
        "the source's checkpoint holds 3 partitions (p0, p1, p2), but the kit can fill only 1 "
        "of them through its test context"
    ) in text


@pytest.mark.slow
@pytest.mark.parametrize("machine_caught", MACHINE_CATCHES)
def test_the_distributed_commit_state_machine_catches_the_variant(runs, machine_caught):
    text = runs[machine_caught][1].read_text()
    assert "| test_distributed_commit_state_machine | failed |" in text, text


@pytest.mark.slow
@pytest.mark.parametrize(("connector", "role"), list(CORRECT))
def test_the_correct_connectors_pass_the_checks_of_what_they_offer(runs, connector, role):
    text = passing_report(runs, connector)
    for check in CORRECT[connector, role]:
        assert f"| {check} | passed |" in text, f"{check} did not pass:\n{text}"


@pytest.mark.slow
def test_a_source_without_replay_skips_the_replay_checks_saying_why(runs):
    text = passing_report(runs, "no-replay-source")
    assert "- Capabilities: no-replay" in text
    reason = "supports_replay() is False: the source cannot go back"
    assert f"  - `test_each_partition_restores_independently`: {reason}" in text
    assert "| test_every_record_is_returned_once_in_batches_of_the_schema | passed |" in text
