"""``GET /api/ha`` on a real shared-store master/slave pair (in-process brokers on one
lease file): the master and the waiting slave each say what they are, and the slave's
answer changes when it takes over."""

from __future__ import annotations

from pathlib import Path

from tests.ha.test_ha_runtime import SlaveBroker, ha_config
from tests.management.http import get
from tests.support.brokers import ThreadBroker, poll


def test_master_slave_roles_and_takeover(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    a = ThreadBroker(ha_config(data, "a")).start()
    b = SlaveBroker(ha_config(data, "b"))
    try:
        master = get(a.management_port, "/api/ha")
        assert (master["mode"], master["role"], master["epoch"], master["broker"],
                master["serving"]) == ("shared", "master", 1, "a", True)
        started = b.start_waiting()
        # The slave's management endpoint is up before anything else is.
        poll(lambda: b.runtime is not None and "management" in b.runtime.addresses, 10,
             "b's management endpoint")
        assert b.runtime is not None
        port = b.runtime.addresses["management"][1]
        poll(lambda: get(port, "/api/ha")["role"] == "slave", 10, "b to wait as a slave")
        slave = get(port, "/api/ha")
        assert (slave["broker"], slave["serving"]) == ("b", False)
        assert get(port, "/api/broker")["role"] == "slave"

        a.stop()  # graceful: hands the lease over
        started.result(10)
        after = get(port, "/api/ha")
        assert (after["role"], after["epoch"], after["serving"]) == ("master", 2, True)
    finally:
        b.stop()
