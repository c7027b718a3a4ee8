"""``[broker] shards``: a count, or "auto"; refused with options it cannot run with yet.
``[shards]``: the settings every shard of the node is given."""

from __future__ import annotations

import os

import pytest

from meshmq.config.model import parse_shards
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError


def test_the_default_is_one_process() -> None:
    assert loads_toml("").shards == 1


def test_a_count_and_auto() -> None:
    assert loads_toml("[broker]\nshards = 4\n").shards == 4
    assert loads_toml('[broker]\nshards = "auto"\n').shards == min(os.cpu_count() or 1, 256)


@pytest.mark.parametrize("value", ["0", "257", "-1", '"many"', "2.5", "true"])
def test_a_bad_count_is_one_line_with_file_line_and_option(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_toml(f'[broker]\nname = "b"\nshards = {value}\n', file="m.toml")
    text = str(err.value)
    assert "m.toml:3" in text and "broker.shards" in text and '"auto"' in text
    assert "\n" not in text


_POSTGRES = '[store]\nkind = "postgres"\ndsn = "dbname=x"\n'
_REPLICATED = '[ha]\nmode = "replicated"\nlisten = "127.0.0.1:{port}"\nmembers = ["h:7000"]\n'


@pytest.mark.parametrize(("extra", "option", "says"), [
    # Shard k's stream listens on the port after ha.listen plus k.
    (_REPLICATED.format(port=65535), "ha.listen", "at most 65535 - shards"),
    # The database lease fences PostgreSQL tables only; a file lease no tables.
    ('[ha]\nmode = "database"\n', "store.kind", 'store.kind = "postgres"'),
    (_POSTGRES + '[ha]\nmode = "shared"\n', "ha.mode", 'ha.mode = "database"'),
])
def test_options_that_do_not_run_with_shards(extra: str, option: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_toml(f"[broker]\nshards = 2\n{extra}", file="m.toml")
    assert "broker.shards" in str(err.value) and option in str(err.value)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_a_node_may_keep_its_shards_in_postgres_with_or_without_a_database_pair() -> None:
    alone = loads_toml(f"[broker]\nshards = 2\n{_POSTGRES}")
    assert (alone.shards, alone.store.kind, alone.ha.mode) == (2, "postgres", "none")
    pair = loads_toml(f'[broker]\nshards = 2\n{_POSTGRES}[ha]\nmode = "database"\n')
    assert (pair.shards, pair.ha.mode) == (2, "database")


def test_a_node_may_be_a_member_of_a_replicated_cluster() -> None:
    config = loads_toml("[broker]\nshards = 2\n" + _REPLICATED.format(port=7100))
    assert (config.shards, config.ha.mode) == (2, "replicated")


def test_a_witness_of_nodes_of_shards_is_configured_with_their_shard_count() -> None:
    # It witnesses each shard's stream on the ports after ha.listen (node/witness.py).
    config = loads_toml("[broker]\nshards = 2\n" + _REPLICATED.format(port=7100)
                        + 'role = "witness"\n')
    assert (config.shards, config.ha.role) == (2, "witness")


def test_a_node_may_be_one_of_a_shared_master_slave_pair() -> None:
    config = loads_toml('[broker]\nshards = 2\n[ha]\nmode = "shared"\n')
    assert (config.shards, config.ha.mode) == (2, "shared")


def test_auto_is_one_per_cpu_within_the_bounds() -> None:
    assert parse_shards("auto", 256, 16) == 16
    assert parse_shards("auto", 256, None) == 1
    assert parse_shards("auto", 256, 1000) == 256
    assert parse_shards("3", 256, 16) == 3
    with pytest.raises(ValueError, match="from 1 to 256"):
        parse_shards(False, 256, 16)


def test_owner_wait_defaults_to_ten_seconds_and_is_read_from_its_section() -> None:
    assert loads_toml("").sharding.owner_wait_ms == 10_000
    config = loads_toml("[broker]\nshards = 2\n\n[shards]\nowner_wait_ms = 250\n")
    assert config.shards == 2 and config.sharding.owner_wait_ms == 250


def test_the_count_and_the_section_do_not_collide() -> None:
    """``[broker] shards`` stays the count; ``[shards]`` is a table of settings."""
    config = loads_toml("[shards]\nowner_wait_ms = 100\n\n[broker]\nshards = 3\n")
    assert (config.shards, config.sharding.owner_wait_ms) == (3, 100)
    with pytest.raises(ConfigError) as err:
        loads_toml("[broker]\nshards = { owner_wait_ms = 100 }\n", file="m.toml")
    assert "broker.shards" in str(err.value)


@pytest.mark.parametrize(("value", "says"), [
    ("99", "must be >= 100"), ("3600001", "must be <= 3600000"), ("-1", "must be >= 100"),
    ('"10 s"', "expected an integer"), ("1.5", "expected an integer"),
])
def test_a_bad_owner_wait_is_one_line_with_file_line_and_option(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_toml(f"[broker]\nshards = 2\n\n[shards]\nowner_wait_ms = {value}\n",
                   file="m.toml")
    text = str(err.value)
    assert "m.toml:5" in text and "shards.owner_wait_ms" in text and says in text, text
    assert "\n" not in text


def test_handoff_is_on_unless_turned_off_and_a_bad_value_is_one_line() -> None:
    assert loads_toml("").sharding.handoff is True
    assert loads_toml("[shards]\nhandoff = false\n").sharding.handoff is False
    with pytest.raises(ConfigError) as err:
        loads_toml("[broker]\nshards = 2\n\n[shards]\nhandoff = \"sometimes\"\n",
                   file="m.toml")
    text = str(err.value)
    assert "m.toml:5" in text and "shards.handoff" in text and "\n" not in text, text


def test_an_unknown_shards_option_is_named_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        loads_toml("[shards]\nowner_wait = 100\n", file="m.toml")
    assert "m.toml:2" in str(err.value) and "owner_wait_ms" in str(err.value)
