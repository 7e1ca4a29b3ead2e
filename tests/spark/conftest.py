"""One shared ``local[2]`` Spark session for every Spark test."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

if importlib.util.find_spec("pyspark") is None:
    # Without the `spark` extra there is nothing here to run.
    collect_ignore_glob = ["*.py"]
else:
    from pyspark.sql import SparkSession

    from laminar_sdk.spark import build_session

    @pytest.fixture(scope="session")
    def spark() -> Iterator[SparkSession]:
        session = build_session(app_name="laminar-sdk-tests")
        yield session
        session.stop()
