"""Checking that a pipeline's connectors can keep the delivery guarantee asked of them."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from laminar_sdk._contract.connector import SinkConnector, SourceConnector
from laminar_sdk._contract.errors import ConfigurationError
from laminar_sdk._contract.types import DeliveryGuarantee


class DeliveryGuaranteeWarning(UserWarning):
    """A pipeline runs, but with weaker delivery than a user might assume."""


def validate_delivery_guarantee(
    guarantee: DeliveryGuarantee,
    *,
    sources: Mapping[str, SourceConnector],
    sinks: Mapping[str, SinkConnector],
    checkpointing_enabled: bool,
) -> None:
    """Check, before anything is opened, that the connectors can keep ``guarantee``.

    Exactly-once requires checkpointing, every source to support replay and every sink to
    declare ``exactly_once``. At-least-once with a source that cannot replay works, but records
    read since the last checkpoint are lost on a crash: that is warned about.

    :param sources: the pipeline's sources, unopened, by connector name.
    :param sinks: the pipeline's sinks, unopened, by connector name.
    :raises ConfigurationError: for the first rule broken, naming the connector.
    :warns DeliveryGuaranteeWarning: at-least-once with a non-replayable source.
    """
    if guarantee is DeliveryGuarantee.EXACTLY_ONCE:
        if not checkpointing_enabled:
            raise ConfigurationError(
                "exactly-once delivery requires checkpointing: configure a checkpoint store "
                "and location, or ask for at-least-once",
                key="delivery",
            )
        for name, source in sources.items():
            if not source.supports_replay():
                raise ConfigurationError(
                    f"exactly-once delivery requires every source to support replay, and "
                    f"source {name!r} does not; use at-least-once, or a replayable source",
                    key="delivery",
                )
        for name, sink in sinks.items():
            if not sink.capabilities().exactly_once:
                raise ConfigurationError(
                    f"exactly-once delivery requires every sink to declare exactly_once, and "
                    f"sink {name!r} does not; use at-least-once, or an exactly-once sink",
                    key="delivery",
                )
        return
    for name, source in sources.items():
        if not source.supports_replay():
            warnings.warn(
                f"source {name!r} cannot replay: with at-least-once delivery, records it "
                "returned after the last checkpoint are lost if the pipeline crashes",
                DeliveryGuaranteeWarning,
                stacklevel=2,
            )
