"""The ``laminar`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from laminar_sdk._cli.checkpoints import add_checkpoint_commands
from laminar_sdk._cli.terminal import format_table
from laminar_sdk._contract.errors import ConfigurationError, LaminarError, PluginError, failure_line
from laminar_sdk._pipeline_files.check import check_pipeline
from laminar_sdk._pipeline_files.file import load_pipeline_file, pipeline_file_help
from laminar_sdk._plugins.loading import load_connector_registry
from laminar_sdk._plugins.registry import ConnectorRole, ConnectorSpec
from laminar_sdk._scaffold import create_plugin_project, next_steps


def _capabilities(spec: ConnectorSpec) -> str:
    return ",".join(spec.capability_names()) or "-"


def _plugins_list(_args: argparse.Namespace) -> int:
    registry = load_connector_registry()
    if not len(registry):
        print("no connectors installed: pip install a plugin (laminar-plugin-...)")
        return 0
    rows = [("CONNECTOR", "ROLE", "DISTRIBUTION", "VERSION", "CAPABILITIES")]
    rows += [
        (spec.name, str(spec.role), spec.distribution, spec.version, _capabilities(spec))
        for spec in registry
    ]
    print(format_table(rows))
    return 0


def _plugins_show(args: argparse.Namespace) -> int:
    registry = load_connector_registry()
    if args.role:
        specs: tuple[ConnectorSpec, ...] = (registry.get(args.name, ConnectorRole(args.role)),)
    else:
        specs = registry.every_role(args.name)
    print("\n\n".join(_describe(spec) for spec in specs))
    return 0


def _describe(spec: ConnectorSpec) -> str:
    """What `laminar plugins show` prints for one role of a connector."""
    lines = [
        f"{spec.name} ({spec.role} connector)",
        f"  distribution: {spec.distribution} {spec.version}".rstrip(),
        f"  capabilities: {_capabilities(spec)}",
    ]
    if spec.description:
        lines.append(f"  {spec.description}")
    if spec.config_prefixes:
        lines.append(f"  passes through keys starting with: {', '.join(spec.config_prefixes)}")
    if not spec.config_keys:
        lines.append("  config keys: none")
        return "\n".join(lines)
    rows = [("KEY", "TYPE", "REQUIRED", "DEFAULT", "DESCRIPTION")]
    for key in spec.config_keys:
        marks = "yes" if key.required else "no"
        tags = [f"path, {key.path.value}"] if key.path is not None else []
        tags += ["secret"] if key.secret else []
        description = " ".join([key.description, *(f"[{tag}]" for tag in tags)]).strip()
        default = "" if key.default is None else key.default
        rows.append((key.name, key.value_type.__name__, marks, default, description))
    lines.append("  config keys:")
    lines += [f"    {line}" for line in format_table(rows).splitlines()]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    registry = load_connector_registry()
    pipeline = load_pipeline_file(Path(args.pipeline), registry=registry)
    if args.connect and not args.check:
        raise ConfigurationError("--connect goes with --check: `laminar run --check --connect`")
    checked = check_pipeline(pipeline, registry, connect=args.connect)
    if args.check:
        print(f"laminar: checked {pipeline.path} (Spark not started):")
        table = format_table([("CHECK", "FOUND"), *((i.what, i.finding) for i in checked)])
        print("\n".join(f"  {line}" for line in table.splitlines()))
        print(f"laminar: {pipeline.path.name} is valid")
        return 0
    for item in checked:
        if item.what == "warning":
            print(f"laminar: warning: {item.finding}", file=sys.stderr)
    try:
        from laminar_sdk._spark import run as spark_run  # noqa: PLC0415 - pyspark only here
    except ImportError as error:
        raise ConfigurationError(
            f"`laminar run` needs Spark: pip install 'laminar-sdk[spark]' ({error})",
            key="pipeline",
        ) from error
    print(
        f"laminar: running {pipeline.path.name}: {pipeline.source} -> {pipeline.sink} "
        f"({pipeline.delivery}) on {pipeline.master}",
        flush=True,
    )
    spark_run.quiet_lost_driver_tracebacks()
    log = spark_run.RunLog.new(pipeline)
    try:
        decided = spark_run.decided_epochs(pipeline, registry)
        query = spark_run.start_pipeline(pipeline, log)
        spark_run.follow(
            query, lambda progress: print(f"  {progress}", flush=True), decided_through=decided
        )
    except KeyboardInterrupt:
        print("laminar: stopped; the next run resumes from the checkpoint", file=sys.stderr)
        log.remove()
        return 130
    except spark_run.PIPELINE_FAILED as error:
        text = spark_run.failure_text(error)
        line = failure_line(text)
        hint = spark_run.checkpoint_hint(line, pipeline) + spark_run.full_disk_hint(text, pipeline)
        print(f"laminar: error: the pipeline failed: {line}{hint}", file=sys.stderr)
        if args.verbose:
            print(text, file=sys.stderr)
        kept = log.keep_failure(text)
        print(f"laminar: Spark's log, with the failure's tracebacks: {kept}", file=sys.stderr)
        return 1
    except spark_run.DRIVER_LOST as error:
        # py4j's traceback of a vanished JVM says nothing the user can act on, and PySpark's
        # exit hooks, still calling the dead JVM, would log it again: logging ends here.
        logging.disable(logging.CRITICAL)
        print(f"laminar: error: {spark_run.driver_lost(error)}", file=sys.stderr)
        print(f"laminar: Spark's log: {log.path}", file=sys.stderr)
        return 1
    log.remove()
    print(f"laminar: done; progress is kept in {pipeline.checkpoint_location}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from laminar_sdk._cli.demo import run_demo  # noqa: PLC0415 - only this command needs it

    return run_demo(args.workdir, conformance=not args.no_conformance)


def _spark_archive(args: argparse.Namespace) -> int:
    from laminar_sdk._spark.class_archive import prepare  # noqa: PLC0415 - pyspark only here

    return prepare(start=args.start)


def _new_plugin(args: argparse.Namespace) -> int:
    project = create_plugin_project(args.name, args.directory, force=args.force)
    names = project.names
    print(
        f"laminar: created plugin {names.name!r} ({names.distribution}, package "
        f"{names.package}) in {project.directory}"
    )
    for created in project.files:
        print(f"  {'replaced' if created.replaced else 'created':<8}  {created.path.as_posix()}")
    print("next steps:")
    print("\n".join(f"  {step}" for step in next_steps(project)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``laminar`` command."""
    parser = argparse.ArgumentParser(
        prog="laminar", description="Laminar SDK: connector plugins for Spark pipelines."
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {metadata.version('laminar-sdk')}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plugins = commands.add_parser("plugins", help="list and inspect installed connectors")
    plugin_commands = plugins.add_subparsers(dest="plugins_command", required=True)
    listing = plugin_commands.add_parser("list", help="every installed connector")
    listing.set_defaults(handler=_plugins_list)
    show = plugin_commands.add_parser(
        "show", help="one connector's description and config keys, for each of its roles"
    )
    show.add_argument("name", help="connector name, as in `laminar plugins list`")
    show.add_argument(
        "--role",
        choices=[r.value for r in ConnectorRole],
        help="show only this role (default: every role the connector has, source first)",
    )
    show.set_defaults(handler=_plugins_show)

    run = commands.add_parser(
        "run",
        help="run a pipeline file on Spark",
        description=pipeline_file_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("pipeline", help="the pipeline file (TOML)")
    run.add_argument(
        "--check",
        action="store_true",
        help="check the file without starting Spark: plugins found, options valid, paths "
        "resolved, delivery guarantee possible; exit status 2 naming the key otherwise",
    )
    run.add_argument(
        "--connect",
        action="store_true",
        help="with --check: also open and close each connector as the run does (servers "
        "reached, tables, topics and columns checked, a query started over refused)",
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="when the pipeline fails, print Spark's whole report (Python and Java tracebacks) "
        "too, not only the one line that says why (it is in Spark's log either way)",
    )
    run.set_defaults(handler=_run)

    demo = commands.add_parser(
        "demo", help="the quick start: an exactly-once pipeline killed and resumed on Spark"
    )
    demo.add_argument("--workdir", type=Path, help="where to put it (default: a new temp dir)")
    demo.add_argument(
        "--no-conformance",
        action="store_true",
        help="skip the conformance kit's quick run on the files sink at the end",
    )
    demo.set_defaults(handler=_demo)

    archive = commands.add_parser(
        "spark-archive",
        help="archive Spark's JVM classes, so that every driver started after starts sooner",
        description=(
            "Make the archive of Spark's classes that drivers started by laminar map (about "
            "30 s, once per Java and Spark installation), and print where it is. A driver "
            "started without one starts its training in the background anyway; run this "
            "first when many drivers follow, as a test run's."
        ),
    )
    archive.add_argument(
        "--start", action="store_true", help="train in the background and return at once"
    )
    archive.set_defaults(handler=_spark_archive)

    new_plugin = commands.add_parser(
        "new-plugin",
        help="start a third-party plugin project: a source, a sink, conformance tests and CI",
        description=(
            "Create a plugin project, laminar-plugin-NAME: a working source and exactly-once "
            "sink against a local directory (the places to change for your system are marked "
            "REPLACE), the conformance kit adopted in its tests, tox and a CI workflow."
        ),
    )
    new_plugin.add_argument(
        "name",
        metavar="NAME",
        help="the plugin's name: lowercase letters, digits, '-' and '_' (such as acme)",
    )
    new_plugin.add_argument(
        "--directory",
        type=Path,
        metavar="DIR",
        help="where to create it (default: ./laminar-plugin-NAME); must be empty unless --force",
    )
    new_plugin.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty directory, replacing files of the same names",
    )
    new_plugin.set_defaults(handler=_new_plugin)

    add_checkpoint_commands(commands)
    _add_installed_commands(commands)
    return parser


COMMAND_ENTRY_POINT_GROUP = "laminar_sdk.commands"
"""Entry points that add subcommands to ``laminar``: each names a callable taking argparse's
subparsers (``add_parser``), as the conformance kit's ``conformance = "...:add_commands"``."""


def _add_installed_commands(commands: argparse._SubParsersAction[Any]) -> None:
    # Other distributions add their commands (the conformance kit adds `laminar conformance`)
    # through entry points, as pytest and tox plugins do: the SDK never imports them.
    for entry_point in metadata.entry_points(group=COMMAND_ENTRY_POINT_GROUP):
        try:
            add_commands = entry_point.load()
            add_commands(commands)
        except Exception as error:  # noqa: BLE001 - any broken plugin: its command says why
            broken = commands.add_parser(entry_point.name, help=f"(cannot load: {error})")
            broken.set_defaults(handler=_unloadable(entry_point, error))
    if "conformance" not in commands.choices:
        missing = commands.add_parser("conformance", help="(pip install laminar-conformance)")
        missing.set_defaults(handler=_conformance_missing)


def _unloadable(
    entry_point: metadata.EntryPoint, error: Exception
) -> Callable[[argparse.Namespace], int]:
    def fail(_args: argparse.Namespace) -> int:
        raise PluginError(
            f"the `laminar {entry_point.name}` command of entry point {entry_point.value!r} "
            f"cannot be loaded: {error!r}; reinstall the distribution that provides it"
        ) from error

    return fail


def _conformance_missing(_args: argparse.Namespace) -> int:
    raise ConfigurationError(
        "`laminar conformance` needs the conformance kit: pip install laminar-conformance "
        "(until it is on PyPI, add --find-links DIR, DIR a wheelhouse; in a checkout: "
        "pip install -e ./conformance; see the README, Installing)",
        key="conformance",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``laminar`` command; return its exit status."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except LaminarError as error:
        print(f"laminar: error: {error}", file=sys.stderr)
        return 2
    return status
