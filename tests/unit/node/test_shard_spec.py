"""What a shard process is given: its own directories, the node's ports, its identity
through the supervisor's pipe."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from meshmq.config.model import (
    BrokerConfig,
    HaConfig,
    ListenerConfig,
    StoreConfig,
    TraceConfig,
)
from meshmq.core.shards import ShardIdentity
from meshmq.node.fence import ShardLease
from meshmq.node.shard import ShardSpec, encode_spec, read_spec
from meshmq.node.supervisor import RestartBackoff, describe_exit, shard_config


def test_each_shard_has_its_own_directories_and_the_node_s_ports(tmp_path: Path) -> None:
    config = BrokerConfig(data_directory=tmp_path, shards=2)
    ports = (ListenerConfig(port=40001),)
    one = shard_config(config, 1, ports)
    assert one.data_directory == tmp_path / "shard-1"
    assert one.store_directory == tmp_path / "shard-1" / "journal"
    assert one.trace_directory == tmp_path / "shard-1" / "trace"
    assert one.listeners == ports and one.shards == 2
    placed = BrokerConfig(data_directory=tmp_path, store=StoreConfig(directory=Path("/s")),
                          trace=TraceConfig(directory=Path("/t")))
    assert shard_config(placed, 0).store_directory == Path("/s/shard-0")
    assert shard_config(placed, 0).trace_directory == Path("/t/shard-0")
    # The supervisor holds a pair's lease; a shard runs no master/slave of its own.
    paired = BrokerConfig(data_directory=tmp_path, shards=2, ha=HaConfig(mode="shared"))
    assert shard_config(paired, 1).ha.mode == "none"


def test_the_spec_travels_through_a_pipe(tmp_path: Path) -> None:
    spec = ShardSpec(BrokerConfig(broker_name="n", shards=2),
                     ShardIdentity(1, 2, "n", str(tmp_path), "token"), "DEBUG",
                     ShardLease(str(tmp_path), "n@host:1:ab", 4, 2))
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, encode_spec(spec))
        assert read_spec(read_end) == spec
    finally:
        os.close(read_end)
        os.close(write_end)


def test_exits_are_described_by_status_or_signal() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with status 3"


def test_restarts_back_off_while_a_shard_keeps_dying_and_reset_once_it_ran() -> None:
    backoff = RestartBackoff(minimum=0.1, maximum=0.5, stable_after=30.0)
    assert [backoff.after_exit(1.0) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff.after_exit(30.0) == 0.1  # it had run a while: a fresh failure
    assert backoff.after_exit(0.5) == 0.2
