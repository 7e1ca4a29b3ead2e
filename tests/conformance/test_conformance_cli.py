"""``laminar conformance run``: runs the suites with pytest, reports, and fails loudly."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from laminar_conformance._budget import BUDGET_FLOOR
from laminar_conformance._cli import add_conformance_commands, generated_module
from laminar_conformance.contexts import ConformancePlugins
from outsider import JSONL_TOKEN, LAG_COUNTER_VARIABLE

from laminar_sdk import ConnectorRole, PluginError, hookimpl


def conformance(*arguments: str, cwd: Path, path: Path | None = None):
    environment = dict(os.environ)
    if path is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(path), *sys.path])
    return subprocess.run(
        [sys.executable, "-m", "laminar_conformance", *arguments],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        check=False,
    )


# What the report and the JUnit file hold, from three checks: a state machine, a fault at each
# of the coordinator's points and the Spark layer (skipped, saying why).
# The memory sink's whole run is `tox -e full`'s (`laminar conformance run memory --role sink`):
# its distributed-commit checks take a minute of CI's twelve.
REPORTED_CHECKS = (
    "test_epoch_protocol_state_machine",
    "test_delivery_survives_a_fault_at_each_point",
    "test_spark_pipeline_killed_at_crash_points_restarts_without_loss",
)


def test_a_reference_sink_passes_with_a_report_and_junit_xml(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMINAR_CACHE_DIR", str(tmp_path / "cache"))
    report, junit = tmp_path / "report.md", tmp_path / "junit.xml"
    checks = [argument for name in REPORTED_CHECKS for argument in ("--check", name)]
    result = conformance(
        "run", "memory", "--role", "sink", "--seed", "5", "--no-spark", *checks,
        "--report", str(report), "--junitxml", str(junit), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert (
        "capabilities: exactly_once, idempotent, two_phase_commit, distributed_commit"
        in result.stdout
    )
    assert re.search(r"test_epoch_protocol_state_machine PASSED \(\d+\.\d s\)", result.stdout), (
        "pytest's progress, with each check's time"
    )
    assert "warning" not in result.stdout.lower(), "a clean run prints no warnings"
    text = report.read_text()
    assert "**Result: PASSED**" in text
    assert "- Capabilities: exactly_once, idempotent, two_phase_commit, distributed_commit" in text
    assert "- Replay: `laminar conformance run memory --role sink --seed 5 --check " in text
    assert "- Spark layer: skipped: switched off (--no-spark" in text
    assert "## Not tested, by category" in text
    assert "  - `test_spark_pipeline_killed_at_crash_points_restarts_without_loss`" in text
    figures = next(line for line in text.splitlines() if line.startswith("- Figures:"))
    cases, faults = (int(figures.split()[i]) for i in (2, 5))
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| test_")]
    assert cases == sum(int(row[2]) for row in rows)
    assert faults == sum(int(row[3]) for row in rows) > 50
    machine = next(row for row in rows if row[0].strip() == "test_epoch_protocol_state_machine")
    ran = int(machine[2])
    # The quick profile's 100 schedules (and those Hypothesis drew and discarded), or fewer
    # when its time budget cut the check short (on a busy machine), which its reason says.
    assert ran >= 100 or (ran >= BUDGET_FLOOR and f"ran {ran} of 100 cases" in machine[-1]), machine
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert int(suite.get("tests")) > 25
    assert int(suite.get("failures")) == 0
    assert not (tmp_path / ".hypothesis").exists(), (
        "Hypothesis's files stay out of the caller's way"
    )
    # What Hypothesis read from the modules is kept in the kit's cache, for the next run.
    assert any((tmp_path / "cache" / "hypothesis" / "constants").iterdir())


def test_without_a_role_every_role_of_the_connector_is_checked(tmp_path):
    # One check both roles have: which roles run is the point, not the checks.
    one_check = ("--check", "test_calls_after_close_raise_closed", "--no-spark")
    result = conformance("run", "memory", *one_check, "--report", "r.md", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "laminar conformance: 'memory', both roles: source passed, sink passed" in result.stdout
    assert "# Conformance report: source `memory`" in (tmp_path / "r.source.md").read_text()
    assert "# Conformance report: sink `memory`" in (tmp_path / "r.sink.md").read_text()
    result = conformance("run", "generator", *one_check, "--report", "r.md", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Spark layer: not run (--no-spark)" in result.stdout
    assert "# Conformance report: source `generator`" in (tmp_path / "r.md").read_text()


def test_strict_fails_a_core_check_skipped_without_a_stated_reason(tmp_path):
    # Two checks skipped: the Spark layer (switched off, no reason stated) and live appends
    # (turned off by the context, saying why); and one that runs.
    checks = (
        "test_spark_pipeline_killed_at_crash_points_restarts_without_loss",
        "test_records_appended_while_reading_are_returned_once_across_restores",
        "test_each_partition_restores_independently",
    )
    result = conformance(
        "run", "generator", "--no-spark", "--strict", "--seed", "2", "--report", "r.md",
        *(argument for check in checks for argument in ("--check", check)), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    assert (
        "--strict: core checks were skipped and the test context stated no reason: "
        "test_spark_pipeline_killed_at_crash_points_restarts_without_loss (spark)"
    ) in result.stderr
    text = (tmp_path / "r.md").read_text()
    assert re.search(r"\*\*Result: FAILED\*\* — \d+ passed, 0 failed", text), text[:400]
    strict = text.split("## Strict: core checks skipped without a stated reason")[1]
    assert "(spark)" in strict
    assert "live-appends" not in strict, "the generator's context states why, so strict accepts it"
    assert (
        "turned off by the test context: the generator's rows are fixed by its configuration"
        in text.split("## Not tested, by category")[1]
    )
    replay = " ".join(f"--check {check}" for check in checks)
    assert (
        f"- Replay: `laminar conformance run generator --role source --seed 2 --strict {replay} "
        "--no-spark`"
    ) in text


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--spark-crashes", "bogus:1"], "--spark-crashes 'bogus:1': expected STEP:EPOCH"),
        (["--spark-crashes", "commit:1", "--no-spark"], "drop one of them"),
        (["--check", "test_no_such_check"], "--check names no sink check: 'test_no_such_check'"),
        (
            ["--check", "test_no_such_check[blackhole]"],
            "--check names no sink check: 'test_no_such_check[blackhole]'",
        ),
        (["--spark-python", "/no/such/python"], "--spark-python /no/such/python: cannot run it"),
        (
            ["--spark-python", "/usr/bin/python3"],
            "--spark-python /usr/bin/python3: its environment lacks PySpark or "
            "laminar-conformance (importlib.metadata.PackageNotFoundError",
        ),
        (["--spark-python", sys.executable, "--no-spark"], "drop one of them"),
        (["--spark-connect", "--no-spark"], "drop one of them"),
        # The test environment has PySpark without its connect extra (pandas, grpcio).
        (
            ["--spark-connect"],
            f"--spark-connect: {sys.executable} cannot run a Spark Connect client (",
        ),
    ],
)
def test_bad_options_are_refused_before_any_check_runs(tmp_path, arguments, message):
    result = conformance("run", "memory", "--role", "sink", *arguments, cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:]
    assert message in result.stderr
    assert "PASSED" not in result.stdout, "a check ran before the options were checked"


def test_a_role_the_connector_does_not_have_names_the_one_it_has(tmp_path):
    result = conformance("run", "generator", "--role", "sink", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        "'generator' is a source connector, not a sink connector: use --role source, or leave "
        "--role out"
    ) in result.stderr


def test_a_failure_shows_its_diagnosis_and_its_traceback_only_with_verbose(tmp_path):
    broken = Path(__file__).parent
    arguments = (
        "run", "broken-forgets-committed-epochs", "--role", "sink", "--plugin", "broken",
        "--seed", "1", "--no-spark",
        "--check", "test_a_committed_epoch_delivered_again_after_a_restart_is_skipped",
    )  # fmt: skip
    quiet = conformance(*arguments, cwd=tmp_path, path=broken)
    assert quiet.returncode == 1, quiet.stdout[-2000:]
    diagnosis = quiet.stderr.split("FAILED test_a_committed_epoch_delivered_again", 1)[1]
    assert "committed epochs 0 (ids 1, 2) and 1 (id 3) delivered again" in diagnosis
    assert "Replay: laminar conformance run broken-forgets-committed-epochs" in diagnosis
    labelled = "[deterministic: failed the same way in all 3 runs with the same seed]"
    check = "test_a_committed_epoch_delivered_again_after_a_restart_is_skipped"
    assert f"FAILED {check} {labelled}" in quiet.stderr
    assert "Traceback" not in quiet.stdout + quiet.stderr
    assert "sink.py:" not in quiet.stdout, "no traceback without -v"
    assert "(-v shows their tracebacks)" in quiet.stderr
    verbose = conformance(*arguments, "-v", "--reruns", "0", cwd=tmp_path, path=broken)
    assert verbose.returncode == 1
    assert "laminar_conformance/sink.py:" in verbose.stdout, "-v shows where the check failed"


def test_a_failure_one_run_in_three_is_labelled_flaky_and_still_fails(tmp_path, monkeypatch):
    monkeypatch.setenv(LAG_COUNTER_VARIABLE, str(tmp_path / "restarts"))
    reports = {name: tmp_path / f"report.{name}" for name in ("md", "xml", "html")}
    check = "test_a_committed_epoch_delivered_again_after_a_restart_is_skipped"
    run = conformance(
        "run", "outsider-sqlite-reads-a-lagging-replica", "--role", "sink",
        "--plugin", "outsider", "--seed", "1", "--no-spark", "--check", check,
        "--report", str(reports["md"]), "--junit", str(reports["xml"]),
        "--html", str(reports["html"]),
        cwd=tmp_path, path=Path(__file__).parent,
    )  # fmt: skip

    assert run.returncode == 1, run.stdout[-2000:]
    label = "flaky (1 of 3)"
    assert f"FAILED {check} [{label}: re-runs 1, 2 passed with the same seed]" in run.stderr
    assert "| failed | 1 | 0 | 0 | 1 |" in reports["md"].read_text()
    assert f"- `{check}`: {label}: " in reports["md"].read_text()
    assert "  - runs: re-runs 1, 2 passed with the same seed" in reports["md"].read_text()
    assert f"<p>{label}: " in reports["html"].read_text()
    (failure,) = ElementTree.parse(reports["xml"]).iter("failure")
    assert failure.get("message", "").startswith(f"[{label}] ")
    assert (tmp_path / "restarts").read_text() == "3", "three runs, one restart each"


def test_a_secret_shown_in_a_log_record_fails_and_no_report_shows_it(tmp_path):
    reports = {name: tmp_path / f"report.{name}" for name in ("md", "xml", "html")}
    run = conformance(
        "run", "outsider-jsonl-logs-its-configuration", "--role", "sink",
        "--plugin", "outsider", "--seed", "1", "--no-spark",
        "--check", "test_health_and_metrics_are_sane", "-v",
        "--report", str(reports["md"]), "--junit", str(reports["xml"]),
        "--html", str(reports["html"]),
        cwd=tmp_path, path=Path(__file__).parent,
    )  # fmt: skip

    assert run.returncode == 1, run.stdout[-2000:]
    assert "(logger 'outsider.jsonl') shows the value of 'token'" in run.stdout + run.stderr
    assert "'token': '***'" in run.stdout, "the captured record is shown, without the secret"
    for where, text in [
        ("stdout", run.stdout),
        ("stderr", run.stderr),
        *((path.name, path.read_text()) for path in reports.values()),
    ]:
        assert JSONL_TOKEN not in text, f"{where} shows the secret"


def test_the_probe_names_a_declared_capability_no_check_exercises(tmp_path):
    report = tmp_path / "report.md"
    run = conformance(
        "run", "upsert-declaring-sink", "--role", "sink", "--plugin", "broken", "--seed", "1",
        "--no-spark", "--check", "test_the_probe_finds_what_the_sink_does",
        "--report", str(report), cwd=tmp_path, path=Path(__file__).parent,
    )  # fmt: skip

    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    probed = next(line for line in report.read_text().splitlines() if line.startswith("- Probed"))
    assert "upsert is declared, but the contract names no key" in probed, probed


def test_an_unknown_connector_is_a_usage_error(tmp_path):
    result = conformance("run", "no-such", "--role", "sink", cwd=tmp_path)
    assert result.returncode == 2
    assert "no sink connector named 'no-such' is installed" in result.stderr


PLUGIN_SOURCE = """
from pathlib import Path

import pyarrow as pa

from laminar_sdk import ConnectorConfig, hookimpl
from laminar_sdk.reference import IDS_SCHEMA, MemorySink


class Context:  # no import of laminar_conformance: the methods are the whole contract
    def __init__(self, workdir):
        self.path = Path(workdir) / "out"

    def config(self):
        return ConnectorConfig("installed-memory", {"path": str(self.path)})

    def batch(self, ids):
        ids = pa.array(list(ids), pa.int64())
        return pa.RecordBatch.from_arrays(
            [ids, pa.array([0] * len(ids), pa.int32()), ids.cast(pa.float64())], schema=IDS_SCHEMA
        )

    def committed_ids(self):
        return MemorySink.committed_ids(self.path)

    def close(self):
        pass


@hookimpl
def laminar_register_connectors(registry):
    registry.add_sink("installed-memory", MemorySink, config_keys=MemorySink.CONFIG_KEYS)
    registry.add_sink("no-context", MemorySink, config_keys=MemorySink.CONFIG_KEYS)


@hookimpl
def laminar_conformance_context(connector, role, workdir):
    return Context(workdir) if (connector, role) == ("installed-memory", "sink") else None
"""


def test_an_installed_plugin_is_checked_through_its_own_context(tmp_path, install_distribution):
    site = install_distribution(
        "laminar-plugin-installed",
        modules={"installed_plugin": PLUGIN_SOURCE},
        plugins={"installed": "installed_plugin"},
    )
    # A check that reads the destination back through the plugin's context. The Spark layer
    # on an installed plugin: tests/test_scaffold.py's generated project (in tox -e full).
    result = conformance(
        "run", "installed-memory", "--seed", "3", "--no-spark",
        "--check", "test_nothing_is_visible_before_commit_epoch", cwd=tmp_path, path=site,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "sink 'installed-memory' from laminar-plugin-installed 1.0.0" in result.stdout


def test_a_plugin_without_a_context_fails_saying_which_hook_to_write(
    tmp_path, install_distribution
):
    site = install_distribution(
        "laminar-plugin-installed",
        modules={"installed_plugin": PLUGIN_SOURCE},
        plugins={"installed": "installed_plugin"},
    )
    # Every check fails the same way: running them again would tell nothing new.
    result = conformance(
        "run", "no-context", "--seed", "3", "--reruns", "0", cwd=tmp_path, path=site
    )
    assert result.returncode == 1
    # Each failed check's diagnosis, on standard error (pytest's summary lines on standard
    # output are cut to the terminal's width, except where $CI is set).
    assert "implement the hook laminar_conformance_context in the plugin" in result.stderr


def test_a_context_lacking_a_method_is_named(tmp_path):
    class Incomplete:
        def config(self): ...

    class Plugin:
        @hookimpl
        def laminar_conformance_context(self, connector, role, workdir):
            return Incomplete() if connector == "null" else None

    plugins = ConformancePlugins.load([Plugin()])
    with pytest.raises(PluginError, match="lacks batch, committed_ids, close"):
        plugins.context("null", ConnectorRole.SINK, tmp_path)
    assert plugins.context("memory", ConnectorRole.SINK, tmp_path).committed_ids() == []


def test_the_generated_module_adopts_the_suite_in_one_class():
    plugins = ConformancePlugins.load()
    spec = plugins.registry.get("generator", ConnectorRole.SOURCE)
    source = generated_module(spec, ["my_plugin"], "laminar conformance run generator")
    assert "from laminar_conformance.source import SourceSuite" in source
    assert "class TestGeneratorSource(SourceSuite):" in source
    assert "    connector = 'generator'" in source
    assert "    plugins = (importlib.import_module('my_plugin'),)" in source
    compile(source, "generated.py", "exec")


def test_the_commands_plug_into_an_argparse_command():
    parser = argparse.ArgumentParser(prog="laminar")
    add_conformance_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["conformance", "run", "memory", "--role", "sink", "--profile", "full", "--seed", "9"]
    )
    assert (args.connector, args.role, args.profile, args.seed) == ("memory", "sink", "full", 9)
    assert callable(args.handler)


def test_pytest_refuses_a_malformed_crash_schedule_before_collecting(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "test_nothing.py", "-p", "no:cacheprovider",
         "--laminar-spark-crashes=commit:1,bogus"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "--laminar-spark-crashes 'bogus': expected STEP:EPOCH" in result.stderr
