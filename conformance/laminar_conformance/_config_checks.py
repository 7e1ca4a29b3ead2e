"""Configuration checks shared by the sink and source suites."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from laminar_conformance._figures import Figures
from laminar_conformance._skips import skip
from laminar_conformance._suite import ConnectorSuite, Target, check
from laminar_sdk import ConfigurationError, ConnectorRole, SinkConnector, SourceConnector

UNKNOWN_KEY = "laminar_conformance_no_such_key"
"""A configuration key no connector declares."""

_NOT_A_VALUE = {int: "not-an-int", float: "not-a-float", bool: "not-a-bool"}


async def _expect_configuration_error(
    target: Target, properties: dict[str, str], key: str, problem: str
) -> None:
    registry = target.plugins.registry
    try:
        if target.role is ConnectorRole.SINK:
            connector: SinkConnector | SourceConnector = (
                await registry.open_sink(target.connector, properties)
            )[0]
        else:
            connector = (await registry.open_source(target.connector, properties))[0]
    except ConfigurationError as error:
        assert error.key == key, (  # noqa: PT017 - the message names the problem and the key
            f"{problem}: the ConfigurationError names key {error.key!r}, not {key!r} ({error})"
        )
        return
    await connector.close()
    pytest.fail(f"{problem}, yet the {target.role} opened without a ConfigurationError")


def _properties(target: Target) -> dict[str, str]:
    context = (
        target.sink_context() if target.role is ConnectorRole.SINK else target.source_context()
    )
    try:
        return context.config().properties
    finally:
        context.close()


class ConfigurationSuite(ConnectorSuite):
    """Bad configuration is a :class:`ConfigurationError` whose ``key`` names the culprit."""

    @check
    def test_an_unknown_config_key_is_an_error_naming_it(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A key the connector does not declare is refused when it is opened."""
        figures.cases += 1
        if UNKNOWN_KEY.startswith(conformance.spec.config_prefixes):
            skip(
                "configuration",
                f"the connector passes every key starting {UNKNOWN_KEY[:8]!r} through",
            )
        properties = {**_properties(conformance), UNKNOWN_KEY: "1"}
        asyncio.run(
            _expect_configuration_error(
                conformance, properties, UNKNOWN_KEY, f"config key {UNKNOWN_KEY!r} is unknown"
            )
        )

    @check
    def test_a_missing_required_config_key_is_an_error_naming_it(
        self, conformance: Target, figures: Figures
    ) -> None:
        """Leaving out each required key is refused, naming the key."""
        properties = _properties(conformance)
        required = [key.name for key in conformance.spec.config_keys if key.required]
        if not required:
            skip("configuration", "the connector declares no required config key")
        for key in required:
            figures.cases += 1
            without = {name: value for name, value in properties.items() if name != key}
            asyncio.run(
                _expect_configuration_error(
                    conformance, without, key, f"required config key {key!r} is missing"
                )
            )

    @check
    def test_a_mistyped_config_value_is_an_error_naming_its_key(
        self, conformance: Target, figures: Figures
    ) -> None:
        """A value that does not parse as its key's declared type is refused, naming the key."""
        properties = _properties(conformance)
        typed = [key for key in conformance.spec.config_keys if key.value_type in _NOT_A_VALUE]
        if not typed:
            skip("configuration", "the connector declares no int, float or bool config key")
        for key in typed:
            figures.cases += 1
            value = _NOT_A_VALUE[key.value_type]
            asyncio.run(
                _expect_configuration_error(
                    conformance,
                    {**properties, key.name: value},
                    key.name,
                    f"config key {key.name!r} is {key.value_type.__name__}, given {value!r}",
                )
            )

    @check
    def test_the_configuration_reaches_the_connector_through_spark_options(
        self, conformance: Target, figures: Figures, tmp_path: Path
    ) -> None:
        """The test context's configuration, given as Spark options, reaches the connector whole.

        Spark's options are case-insensitive: their keys arrive lower-cased, and the bridge
        gives declared keys their declared case back. A pass-through key (under one of the
        connector's ``config_prefixes``) keeps Spark's lower case, and a key the bridge keeps
        for itself (``connector``, ``checkpointLocation``, ``laminar.*``) never arrives.
        """
        from laminar_conformance._runtime_checks import spark_bridge  # noqa: PLC0415

        figures.cases += 1
        bridge = spark_bridge()
        properties = _properties(conformance)
        options = {key.lower(): value for key, value in properties.items()}
        options.update(connector=conformance.connector, checkpointlocation=str(tmp_path))
        try:
            parsed = bridge.parse_options(options, conformance.role, conformance.plugins.registry)
        except ConfigurationError as error:
            pytest.fail(
                f"the test context's configuration {sorted(properties)}, given to Spark as "
                f"options, is refused by the bridge: {error}"
            )
        arrived = parsed.properties
        problems = [
            f"{key!r} reaches it as {key.lower()!r}"
            if key.lower() in arrived and key not in arrived
            else f"{key!r} never reaches it"
            for key in properties
            if arrived.get(key) != properties[key]
        ]
        assert not problems, (
            f"on Spark, the {conformance.role}'s configuration does not arrive as given: "
            f"{'; '.join(problems)}. Spark's option keys are case-insensitive and arrive "
            "lower-cased: declare each key the connector reads (declared keys keep their "
            "case), or read keys under config_prefixes in lower case; keys named connector, "
            "checkpointLocation or laminar.* belong to the bridge"
        )
