"""The order the suite runs its files in comes from their recorded times, kept current."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).parents[1]
DURATIONS = Path(__file__).with_name("durations.json")


def test_the_recorded_durations_name_only_test_files_that_exist() -> None:
    recorded = json.loads(DURATIONS.read_text(encoding="utf-8"))
    gone = [path for path in recorded if not (ROOT / path).is_file()]
    assert not gone, (
        f"{DURATIONS.name} names test files that are gone: {gone}. Record the times again: "
        "python3 -m tox -e checks -- -m 'not full' -n 3 --dist loadfile --record-durations"
    )
    assert list(recorded.values()) == sorted(recorded.values(), reverse=True)
