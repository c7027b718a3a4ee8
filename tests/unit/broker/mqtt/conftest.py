"""The MQTT broker tests' default broker: one driven in memory with the default config.
A test file whose broker needs other settings defines its own ``env``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.memory_mqtt import MqttEnv, mqtt_env


@pytest.fixture
def env() -> Iterator[MqttEnv]:
    with mqtt_env() as e:
        yield e
