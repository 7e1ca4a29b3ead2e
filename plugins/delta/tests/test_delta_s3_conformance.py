"""The conformance kit on the ``delta`` sink writing to S3: moto's server on loopback.

The sink's test context puts its table on an S3-compatible server when told to
(``LAMINAR_DELTA_SINK_URI``, ``LAMINAR_DELTA_SINK_S3_ENDPOINT``) and then names the server as its
network endpoint, so the kit's network-fault checks run with a proxy (Toxiproxy) between the sink
and the store: latency, reset connections, a silent partition, a trickle. Each run is
``laminar conformance run`` in a child process. CI runs the network checks; the whole quick profile
on S3 (about seven minutes on two cores) runs under ``full``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from delta_kit import run_kit

from laminar_plugin_delta.testing import SINK_S3_ENDPOINT_VARIABLE, SINK_URI_VARIABLE

if importlib.util.find_spec("moto") is None:
    pytest.skip("needs moto: pip install 'laminar-conformance[s3]'", allow_module_level=True)

from laminar_conformance.services import S3Endpoint, moto_s3_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 server on loopback, with one bucket; stopped at the end, pass or fail."""
    with moto_s3_server() as endpoint:
        yield endpoint


def run_on_s3(endpoint: S3Endpoint, directory: Path, *arguments: str) -> str:
    """``laminar conformance run delta --role sink`` on ``endpoint``; its exit and output."""
    environment = {
        SINK_URI_VARIABLE: endpoint.location("conformance"),
        SINK_S3_ENDPOINT_VARIABLE: endpoint.url,
        "AWS_ACCESS_KEY_ID": endpoint.access_key_id,
        "AWS_SECRET_ACCESS_KEY": endpoint.secret_access_key,
        "AWS_REGION": endpoint.region,
    }
    return run_kit(directory, "delta", *arguments, environment=environment)


def test_network_faults_between_the_sink_and_s3_end_calls_cleanly_and_lose_nothing(
    s3_endpoint, tmp_path
):
    check = "test_a_network_fault_ends_calls_cleanly_and_loses_nothing"
    output = run_on_s3(s3_endpoint, tmp_path, "--check", check)
    assert output.startswith("exit 0\n"), output[-6000:]
    for fault in ("latency", "reset", "blackhole", "bandwidth"):
        assert f"{check}[{fault}] PASSED" in output, output[-6000:]


@pytest.mark.full
def test_the_quick_profile_passes_on_s3(s3_endpoint, tmp_path):
    output = run_on_s3(s3_endpoint, tmp_path)
    assert output.startswith("exit 0\n"), output[-6000:]
    assert "every applicable check passed" in output, output[-6000:]
