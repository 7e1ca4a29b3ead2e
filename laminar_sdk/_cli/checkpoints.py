"""``laminar checkpoints ...``: look into a checkpoint store from the shell, and repair it."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.errors import CheckpointNotFound, CheckpointStoreError
from laminar_sdk._checkpointing.ids import CheckpointId, parse_artifact_path
from laminar_sdk._checkpointing.manifest import CheckpointManifest
from laminar_sdk._checkpointing.recovery import mark_committed, verify_checkpoint
from laminar_sdk._checkpointing.registry import open_checkpointer
from laminar_sdk._cli.terminal import format_table
from laminar_sdk._contract.errors import CheckpointError, ConfigurationError
from laminar_sdk._spark.read_log import (
    LoggedMicroBatch,
    damaged_slices,
    laminar_location_of,
    read_log_location,
    slices_in_offset_log,
)


def _option(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key:
        # The text is not echoed: it may be a credential typed without its key.
        raise argparse.ArgumentTypeError("expected KEY=VALUE")
    return key, value


def _open(args: argparse.Namespace, location: str | None = None) -> Checkpointer:
    """The store at ``location``, by default the command's ``LOCATION`` (never a read log)."""
    if location is None:
        location = args.location
        _refuse_a_read_log(location)
    return open_checkpointer(location, store=args.store, options=dict(args.option or ()))


def _refuse_a_read_log(location: str) -> None:
    """Raise when ``location`` is a read log: its entries are not checkpoints."""
    laminar = laminar_location_of(location)
    if laminar is None:
        return
    raise ConfigurationError(
        f"{location} is a polled source's read log, whose entries are not checkpoints. Give "
        f"the laminar location instead: `laminar checkpoints verify {laminar}` checks the "
        "read log with the checkpoints, naming the micro-batch of each damaged slice and "
        f"whether Spark still needs it; `laminar checkpoints quarantine {laminar} ENTRY` sets "
        "a damaged entry aside",
        key="LOCATION",
    )


def _handler(
    command: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def handle(args: argparse.Namespace) -> int:
        return asyncio.run(command(args))

    return handle


def _taken(manifest: CheckpointManifest) -> str:
    moment = dt.datetime.fromtimestamp(manifest.timestamp_ms / 1000, tz=dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    scaled = size / 1024
    for unit in ("KiB", "MiB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} GiB"


def _sinks(manifest: CheckpointManifest) -> str:
    return ",".join(f"{sink}={status}" for sink, status in manifest.sink_statuses.items()) or "-"


async def _latest_or_problem(
    store: Checkpointer,
) -> tuple[CheckpointId | None, CheckpointError | None]:
    try:
        return await store.read_latest(), None
    except CheckpointError as error:
        return None, error


def missing_epochs(manifests: list[CheckpointManifest], latest: CheckpointId | None) -> list[str]:
    """Where the readable ``manifests`` skip epochs: one line per gap, none when they don't.

    Each epoch the runtime commits leaves a checkpoint of its own, numbered one after the
    other; retention removes the oldest only. A gap between two completed ones (not newer
    than the ``latest`` pointer) is a manifest deleted or lost (its checkpoint's directory
    may be left, empty). A checkpoint that ``laminar checkpoints mark-committed`` made (it
    names no sink) may jump: no gap before it. Quarantining one moves the pointer back before
    it, so what it leaves is not completed.
    """
    completed = [m for m in manifests if latest is not None and m.checkpoint_id <= latest]
    ordered = sorted(completed, key=lambda manifest: manifest.epoch)
    gaps = []
    for before, after in itertools.pairwise(ordered):
        if after.epoch > before.epoch + 1 and after.sink_statuses:
            first, last = before.epoch + 1, after.epoch - 1
            epochs = f"epoch {first}" if first == last else f"epochs {first} to {last}"
            gaps.append(
                f"no checkpoint of {epochs}, between {before.checkpoint_id} (epoch "
                f"{before.epoch}) and {after.checkpoint_id} (epoch {after.epoch}): deleted or "
                "lost. Recovery does not need it (it resumes from the latest); restore it from "
                "a backup to keep the history whole"
            )
    return gaps


async def _checkpoints_list(args: argparse.Namespace) -> int:
    store = _open(args)
    ids = await store.list_checkpoints()
    latest, problem = await _latest_or_problem(store)
    if problem is not None:
        print(f"warning: {problem}")
    if not ids:
        print(f"no checkpoints at {store.location}")
        return 0
    rows = [("CHECKPOINT", "EPOCH", "TAKEN (UTC)", "SIZE", "SINKS", "")]
    readable = []
    for checkpoint_id in reversed(ids):
        mark = "latest" if checkpoint_id == latest else ""
        try:
            manifest = await store.load_manifest(checkpoint_id)
        except CheckpointError as error:
            unreadable = f"unreadable manifest ({type(error).__name__})"
            rows.append((str(checkpoint_id), "?", "?", "?", unreadable, mark))
            continue
        readable.append(manifest)
        rows.append(
            (
                str(checkpoint_id),
                str(manifest.epoch),
                _taken(manifest),
                _size(manifest.total_size_bytes),
                _sinks(manifest),
                mark,
            )
        )
    print(f"{len(ids)} checkpoint(s) at {store.location}, newest first:")
    print(format_table(rows))
    for gap in missing_epochs(readable, latest):
        print(f"warning: {gap}")
    return 0


async def _checkpoints_show(args: argparse.Namespace) -> int:
    store = _open(args)
    if args.checkpoint:
        checkpoint_id = CheckpointId.parse(args.checkpoint)
    else:
        latest = await store.read_latest()
        if latest is None:
            raise CheckpointError(
                f"no latest checkpoint at {store.location}; name one from "
                "`laminar checkpoints list LOCATION`"
            )
        checkpoint_id = latest
    manifest = await store.load_manifest(checkpoint_id)
    if args.json:
        print(manifest.to_json().decode(), end="")
        return 0
    print(f"checkpoint {manifest.checkpoint_id} at {store.location}")
    print(f"  epoch: {manifest.epoch}")
    print(f"  taken: {_taken(manifest)} UTC")
    print(f"  parent: {manifest.parent_id or '-'}")
    print(f"  watermark: {'-' if manifest.watermark is None else manifest.watermark}")
    print(f"  size: {_size(manifest.total_size_bytes)} ({manifest.total_size_bytes} bytes)")
    print(f"  sinks: {_sinks(manifest)}")
    print("  sources:" if manifest.source_offsets else "  sources: -")
    for source, checkpoint in manifest.source_offsets.items():
        print(f"    {source}: {checkpoint.to_json()}")
    print("  operators:" if manifest.operators else "  operators: -")
    rows = [("OPERATOR", "PARTITION", "KIND", "SIZE", "SHA256", "PATH")]
    rows += [
        (
            operator,
            str(entry.partition_id),
            "delta" if entry.is_delta else "snapshot",
            str(entry.size_bytes),
            entry.sha256[:12],
            entry.path,
        )
        for operator, entry in manifest.partitions()
    ]
    if manifest.operators:
        print("\n".join(f"    {line}" for line in format_table(rows).splitlines()))
    return 0


def _pointer_verdict(
    latest: CheckpointId | None, problem: CheckpointError | None, ids: list[CheckpointId]
) -> tuple[str, bool]:
    """What ``verify`` says of the latest pointer, and whether it is bad."""
    if problem is not None:
        return f"BAD: {problem}", True
    if latest is None:
        return "none (no checkpoint was completed)", False
    if latest not in ids:
        return f"BAD: names {latest}, which has no manifest", True
    return str(latest), False


async def _checkpoints_verify(args: argparse.Namespace) -> int:
    store = _open(args)
    ids = await store.list_checkpoints()
    latest, pointer_problem = await _latest_or_problem(store)
    print(f"verifying {len(ids)} checkpoint(s) at {store.location}")
    bad_paths: list[str] = []
    readable: list[CheckpointManifest] = []
    for number, checkpoint_id in enumerate(ids, start=1):
        problems = await verify_checkpoint(store, checkpoint_id)
        if not problems:
            readable.append(await store.load_manifest(checkpoint_id))
        verdict = "ok" if not problems else f"BAD ({len(problems)} bad file(s))"
        if latest is not None and checkpoint_id > latest:
            verdict += " (not completed: newer than the latest pointer)"
        print(f"[{number}/{len(ids)}] {checkpoint_id} {verdict}", flush=True)
        for problem in problems:
            print(f"    {problem}")
            if isinstance(problem, CheckpointStoreError):
                bad_paths.append(problem.path)
    pointer, pointer_bad = _pointer_verdict(latest, pointer_problem, ids)
    print(f"latest pointer: {pointer}")
    if pointer_bad:
        bad_paths.append(store.latest_path())
    gaps = missing_epochs(readable, latest)
    for gap in gaps:
        print(f"missing: {gap}")
    if bad_paths:
        print(f"FAILED: {len(bad_paths)} bad file(s) at {store.location}:")
        for path in bad_paths:
            print(f"  {path}")
        print(
            "recovery passes over these: restore them from a backup, or set a checkpoint "
            f"aside with `laminar checkpoints quarantine {store.location} ID`"
        )
        return 1
    if gaps:
        print(f"FAILED: {len(gaps)} gap(s) in the checkpoints at {store.location}")
        return 1
    if not await _read_log_intact(args):
        return 1
    print(f"all {len(ids)} checkpoint(s) valid")
    return 0


async def _read_log_intact(args: argparse.Namespace) -> bool:
    """Check the read log beside the checkpoints, if there is one; ``False`` when damaged.

    A slice is checked against the SHA-256 Spark's offset log records for it, when that log
    is where Spark keeps it by default (``offsets`` beside a local laminar location);
    otherwise it must decode. A damaged slice of a micro-batch Spark committed is no longer
    needed (the next commit deletes it).
    """
    store = _open(args, read_log_location(args.location))
    stored = await store.list_artifacts()
    if not stored:
        return True
    named: dict[str, LoggedMicroBatch] = {}
    committed: set[int] = set()
    if "://" not in args.location:
        spark = Path(args.location).parent
        named = slices_in_offset_log(spark / "offsets")
        committed = {int(done.name) for done in _listed(spark / "commits") if done.name.isdigit()}
    how = (
        "against the SHA-256s in Spark's offset log"
        if named
        else "by decoding them (Spark's offset log is not beside the location)"
    )
    damaged = await damaged_slices(store, stored, named)
    print(f"read log at {store.location}: {len(stored)} slice(s) checked {how}")
    needed: dict[CheckpointId, None] = {}
    for path, why in damaged:
        logged = named.get(path)
        batch = f" (micro-batch {logged.micro_batch})" if logged else ""
        if logged is not None and logged.micro_batch in committed:
            print(f"    {path}{batch} {why}: no longer needed, Spark committed it")
            continue
        print(f"    BAD {path}{batch} {why}")
        needed[parse_artifact_path(path).checkpoint_id] = None
    if not needed:
        return True
    entries = " ".join(str(entry) for entry in needed)
    print(
        f"FAILED: {len(needed)} read-log entr{'y' if len(needed) == 1 else 'ies'} with damaged "
        "slices, of micro-batches Spark has not committed. Set them aside with `laminar "
        f"checkpoints quarantine {args.location} {entries}` and restart: a source that can "
        "replay reads those micro-batches again, restored to their start offsets, and the run "
        "delivers them only if the source reaches the end offsets Spark logged (else it says "
        "so). For a source that cannot replay, restore the laminar location from a backup "
        "taken with Spark's checkpoint, or delete both locations to start the query over"
    )
    return False


async def _quarantine_read_log_entry(args: argparse.Namespace, entry: CheckpointId) -> bool:
    """Set the read-log entry ``entry`` aside; ``False`` when the read log holds no such entry."""
    log = _open(args, read_log_location(args.location))
    try:
        moved = await log.quarantine_checkpoint(entry)
    except CheckpointNotFound:
        return False
    print(f"set read-log entry {entry} aside: {len(moved)} file(s) moved to")
    for path in moved:
        print(f"  {path} (at {log.location})")
    print(
        "the next run reads its micro-batch again from the source if the source can replay: "
        "restored to the micro-batch's start offset, and delivered only if it reaches the end "
        "offset Spark logged; otherwise the run fails saying why (restore the laminar location "
        "from a backup taken with Spark's checkpoint then)"
    )
    return True


def _listed(directory: Path) -> list[Path]:
    return sorted(directory.iterdir()) if directory.is_dir() else []


async def _checkpoints_quarantine(args: argparse.Namespace) -> int:
    store = _open(args)
    ids = [CheckpointId.parse(text) for text in args.checkpoints]
    for checkpoint_id in ids:
        try:
            moved = await store.quarantine_checkpoint(checkpoint_id)
        except CheckpointNotFound:
            if not await _quarantine_read_log_entry(args, checkpoint_id):
                raise
            continue
        print(f"set checkpoint {checkpoint_id} aside: {len(moved)} file(s) moved to")
        for path in moved:
            print(f"  {path}")
    latest, problem = await _latest_or_problem(store)
    if problem is not None:
        print(f"warning: {problem}")
    else:
        print(f"latest checkpoint at {store.location}: {latest or 'none'}")
    return 0


async def _checkpoints_mark_committed(args: argparse.Namespace) -> int:
    store = _open(args)
    manifest = await mark_committed(store, args.epoch, query_id=args.query_id)
    print(
        f"checkpoint {manifest.checkpoint_id} at {store.location} records epochs up to "
        f"{manifest.epoch} as committed; the next run resumes with epoch {manifest.epoch + 1}"
    )
    return 0


def add_checkpoint_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``checkpoints list|show|verify|quarantine|mark-committed`` to ``laminar``."""
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "location", help="the checkpoint location: a directory, file://, memory://, s3://..."
    )
    where.add_argument(
        "--store", help="the checkpoint store (default: chosen by the location's scheme)"
    )
    where.add_argument(
        "-o",
        "--option",
        action="append",
        type=_option,
        metavar="KEY=VALUE",
        help="a store option, e.g. -o endpoint=http://127.0.0.1:9000 (repeatable)",
    )
    checkpoints = commands.add_parser(
        "checkpoints", help="list, show, verify and repair stored checkpoints"
    )
    checkpoint_commands = checkpoints.add_subparsers(dest="checkpoints_command", required=True)
    listing = checkpoint_commands.add_parser(
        "list", parents=[where], help="every checkpoint, newest first, with the latest marked"
    )
    listing.set_defaults(handler=_handler(_checkpoints_list))
    show = checkpoint_commands.add_parser(
        "show", parents=[where], help="one checkpoint's manifest (default: the latest)"
    )
    show.add_argument("checkpoint", nargs="?", help="the checkpoint id (default: the latest)")
    show.add_argument("--json", action="store_true", help="print the stored manifest JSON")
    show.set_defaults(handler=_handler(_checkpoints_show))
    verify = checkpoint_commands.add_parser(
        "verify",
        parents=[where],
        help="check every manifest and artifact (sha256), and the read log of a polled source "
        "beside them; exit 1 naming each bad file",
    )
    verify.set_defaults(handler=_handler(_checkpoints_verify))
    quarantine = checkpoint_commands.add_parser(
        "quarantine",
        parents=[where],
        help="set corrupted checkpoints aside (moved under quarantine/, never loaded again)",
    )
    quarantine.add_argument(
        "checkpoints", nargs="+", metavar="ID", help="a checkpoint id, or a read-log entry's"
    )
    quarantine.set_defaults(handler=_handler(_checkpoints_quarantine))
    mark = checkpoint_commands.add_parser(
        "mark-committed",
        parents=[where],
        help="record that every epoch up to --epoch is committed (when Spark's commit log "
        "proves it and the laminar location lost it)",
    )
    mark.add_argument("--epoch", type=int, required=True, help="the newest committed epoch")
    mark.add_argument("--query-id", help="Spark's id of the streaming query the epochs belong to")
    mark.set_defaults(handler=_handler(_checkpoints_mark_committed))
