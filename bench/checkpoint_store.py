"""Benchmark: how long one checkpoint takes in each checkpoint store.

One checkpoint = one 1 MiB operator snapshot, the manifest, and the latest-pointer update, in
that order, as the runtime does it. Measured N times (default 1,000) per store, after a few
untimed warm-up checkpoints; retention (keep 3) runs untimed every 50 checkpoints so the store
stays small. Prints p50 and p99 per store and whether the target is met.

Target: p99 under 25 ms for ``file`` (on local disk). The ``object`` store runs against moto's
S3 server on loopback (needs ``pip install 'laminar-conformance[s3]'``); it has no target, as
loopback moto says little about a real object store's latency.

    python bench/checkpoint_store.py [--iterations 1000] [--stores file,object]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from laminar_sdk import (
    Checkpointer,
    CheckpointId,
    CheckpointManifest,
    SinkEpochStatus,
    open_checkpointer,
    prune_checkpoints,
)

FILE_P99_TARGET_MS = 25.0
WARM_UP = 20
PRUNE_EVERY = 50


async def _checkpoint(store: Checkpointer, epoch: int, state: bytes) -> None:
    checkpoint_id = CheckpointId.new()
    entry = await store.save_partition(checkpoint_id, "agg", 0, state)
    manifest = (
        CheckpointManifest.new(epoch, checkpoint_id=checkpoint_id)
        .with_partition("agg", entry)
        .with_sink_status("sink", SinkEpochStatus.PENDING)
    )
    await store.save_manifest(manifest)
    await store.update_latest(checkpoint_id)


async def _measure(store: Checkpointer, iterations: int, state: bytes) -> list[float]:
    timings: list[float] = []
    for epoch in range(WARM_UP + iterations):
        started = time.perf_counter()
        await _checkpoint(store, epoch, state)
        elapsed = time.perf_counter() - started
        if epoch >= WARM_UP:
            timings.append(elapsed * 1000)
        if epoch % PRUNE_EVERY == 0:
            await prune_checkpoints(store, keep=3, orphan_grace_s=0)
        if epoch >= WARM_UP and (epoch - WARM_UP + 1) % 250 == 0:
            print(f"  {epoch - WARM_UP + 1}/{iterations} checkpoints", flush=True)
    return timings


def _percentile(sorted_ms: list[float], fraction: float) -> float:
    return sorted_ms[max(0, math.ceil(fraction * len(sorted_ms)) - 1)]


def _file_system(path: Path) -> str:
    best, kind = "", "unknown"
    for line in (
        Path("/proc/mounts").read_text().splitlines() if os.path.exists("/proc/mounts") else []
    ):
        _, mount_point, fs_type, *_ = line.split()
        if str(path).startswith(mount_point) and len(mount_point) > len(best):
            best, kind = mount_point, fs_type
    return kind


@contextmanager
def _file_location() -> Iterator[tuple[str, dict[str, str], str]]:
    with tempfile.TemporaryDirectory(prefix="laminar-bench-") as directory:
        yield directory, {}, f"{directory} ({_file_system(Path(directory))})"


@contextmanager
def _object_location() -> Iterator[tuple[str, dict[str, str], str]]:
    from laminar_conformance.services import moto_s3_server  # noqa: PLC0415 - optional

    with moto_s3_server() as endpoint:
        yield endpoint.location("bench"), endpoint.checkpointer_options(), f"moto at {endpoint.url}"


def main() -> int:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--stores", default="file,object", help="comma-separated store names")
    args = parser.parse_args()
    state = os.urandom(1024 * 1024)
    locations = {"file": _file_location, "object": _object_location}
    met = True
    for name in args.stores.split(","):
        with locations[name]() as (location, options, where):
            print(f"{name}: {args.iterations} checkpoints of 1 MiB + manifest + pointer, {where}")
            store = open_checkpointer(location, store=name, options=options)
            timings = sorted(asyncio.run(_measure(store, args.iterations, state)))
        p50, p99 = _percentile(timings, 0.50), _percentile(timings, 0.99)
        line = (
            f"{name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, mean {statistics.fmean(timings):.2f} ms, "
            f"max {timings[-1]:.2f} ms"
        )
        if name == "file":
            verdict = "met" if p99 < FILE_P99_TARGET_MS else "NOT met"
            met = met and p99 < FILE_P99_TARGET_MS
            line += f" -- target p99 < {FILE_P99_TARGET_MS:.0f} ms: {verdict}"
        else:
            line += " -- no target"
        print(line, flush=True)
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
