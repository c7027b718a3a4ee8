"""Which lease backend a configuration builds, the holder id a broker gets when none is
configured, and the [ha] settings the TOML loader refuses, each naming its option."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshmq.config.model import BrokerConfig, HaConfig, StoreConfig
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError
from meshmq.ha.file_lease import FileLease
from meshmq.ha.pg_lease import PgLease
from meshmq.ha.setup import create_backend, default_holder_id


def test_shared_mode_puts_the_lease_file_in_the_store_directory(tmp_path: Path) -> None:
    config = BrokerConfig(data_directory=tmp_path, ha=HaConfig(mode="shared", holder_id="h1"))
    backend = create_backend(config)
    assert isinstance(backend, FileLease)
    assert (backend.directory, backend.holder) == (config.store_directory, "h1")
    backend.close()


def test_database_mode_keeps_its_lease_next_to_the_postgres_store() -> None:
    config = BrokerConfig(store=StoreConfig(kind="postgres", dsn="host=db",
                                            table_prefix="amq_"),
                          ha=HaConfig(mode="database", lease_ms=7000, holder_id="h2"))
    backend = create_backend(config)
    assert isinstance(backend, PgLease)  # no connection is made before it is used
    assert (backend.dsn, backend.holder, backend.lease_ms, backend.prefix) == (
        "host=db", "h2", 7000, "amq_")


def test_database_mode_without_a_dsn_names_the_option() -> None:
    config = BrokerConfig(store=StoreConfig(kind="postgres"), ha=HaConfig(mode="database"))
    with pytest.raises(ConfigError, match=r"needs store\.dsn") as info:
        create_backend(config)
    assert info.value.option == "store.dsn"


def test_an_unknown_mode_names_the_option() -> None:
    with pytest.raises(ConfigError, match="unknown ha mode 'pure'") as info:
        create_backend(BrokerConfig(ha=HaConfig(mode="pure")))
    assert info.value.option == "ha.mode"


def test_default_holder_ids_differ_between_processes_of_one_broker() -> None:
    """A restarted broker is a new holder: its previous life's record is not its own."""
    config = BrokerConfig(broker_name="b1")
    first, second = default_holder_id(config), default_holder_id(config)
    assert first != second
    assert first.startswith("b1@") and second.startswith("b1@")


def test_a_long_broker_name_is_cut_so_the_holder_id_fits_the_lease() -> None:
    holder = default_holder_id(BrokerConfig(broker_name="n" * 200))
    assert len(holder.encode()) <= 64
    assert holder.startswith("n" * 10) and "@" in holder


def test_the_lease_file_accepts_a_default_holder_id(tmp_path: Path) -> None:
    lease = FileLease(tmp_path, default_holder_id(BrokerConfig(broker_name="x" * 100)))
    assert lease.try_acquire(None) == 1
    lease.close()


SHARED = '[ha]\nmode = "shared"\n'


@pytest.mark.parametrize(("text", "option", "message"), [
    (SHARED + "lease_ms = 50\n", "ha.lease_ms", "100"),
    (SHARED + "keepalive_ms = 5\n", "ha.keepalive_ms", "10"),
    (SHARED + "acquire_interval_ms = 1\n", "ha.acquire_interval_ms", "10"),
    (SHARED + 'lease_ms = "5s"\n', "ha.lease_ms", "integer"),
    (SHARED + "holder_id = '" + "h" * 65 + "'\n", "ha.holder_id", "1 to 64 bytes"),
    (SHARED + 'role = "arbiter"\n', "ha.role", "must be one of"),
    ('[broker]\npersistent = false\n' + SHARED, "ha.mode", "needs a persistent"),
], ids=["lease", "keepalive", "acquire-interval", "lease-type", "holder-length", "role",
        "not-persistent"])
def test_bad_ha_settings_name_their_option(text: str, option: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        loads_toml(text, file="meshmq.toml")
    assert info.value.option == option
    assert "\n" not in str(info.value)


def test_an_unknown_ha_setting_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError, match="lease_ms") as info:
        loads_toml(SHARED + "lease_mss = 3000\n")
    assert info.value.option is not None and "lease_mss" in info.value.option


def test_a_keepalive_of_exactly_half_the_lease_is_accepted() -> None:
    config = loads_toml(SHARED + "lease_ms = 1000\nkeepalive_ms = 500\n")
    assert (config.ha.lease_ms, config.ha.keepalive_ms) == (1000, 500)


REPLICATED = ('[ha]\nmode = "replicated"\nlisten = "h:1"\nmembers = ["h:2"]\n')


@pytest.mark.parametrize(("extra", "option", "message"), [
    ('ssl_cafile = "ca.pem"\n', "ha.ssl_certfile", "needs ssl_certfile"),
    ('ssl_keyfile = "k.pem"\n', "ha.ssl_keyfile", "needs ssl_certfile"),
    ("node_id = ''\n", "ha.node_id", "1 to 64 bytes"),
], ids=["ca-without-cert", "key-without-cert", "empty-node-id"])
def test_bad_replication_settings_name_their_option(extra: str, option: str,
                                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        loads_toml(REPLICATED + extra)
    assert info.value.option == option


def test_a_replicated_config_keeps_its_defaults() -> None:
    ha = loads_toml(REPLICATED).ha
    defaults = HaConfig()
    assert dataclasses.replace(ha, mode="none", listen="", members=()) == defaults
