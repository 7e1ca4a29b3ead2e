"""Fixtures shared by the checkpoint-store tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
from laminar_conformance.services import S3Endpoint, moto_s3_server


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 server on loopback, with one bucket; stopped at the end, pass or fail."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("obstore") is None:
        pytest.skip("needs moto and obstore: pip install 'laminar-conformance[s3]'")
    with moto_s3_server() as endpoint:
        yield endpoint
