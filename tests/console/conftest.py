"""A real headless Chromium (Selenium) for the web console tests, and a network of three
in-thread brokers A -> B -> C."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import BrokerConfig
from tests.network.helpers import connector, net_config, tcp_uri, wait_forwarding
from tests.support.brokers import ThreadBroker

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")


def chromium_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture
def browser() -> Iterator[Any]:
    paths = chromium_paths()
    if paths is None:
        pytest.skip("chromium and chromedriver are not installed (dev/system-packages)")
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--no-first-run", "--no-proxy-server"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=paths[1])
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Network:
    """Brokers A, B, C with bridges A->B and B->C. A stopped broker can be started again
    on the same ports (its peers' bridges reconnect to the address they know)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.brokers: dict[str, ThreadBroker] = {}
        self.running: set[str] = set()

    def start(self) -> Network:
        self._run("C", net_config(self.root / "c", "C"))
        self._run("B", net_config(self.root / "b", "B", connector(tcp_uri(self.brokers["C"]))))
        self._run("A", net_config(self.root / "a", "A", connector(tcp_uri(self.brokers["B"]))))
        wait_forwarding(self.brokers["A"])
        wait_forwarding(self.brokers["B"])
        return self

    def _run(self, name: str, config: BrokerConfig) -> None:
        self.brokers[name] = ThreadBroker(config).start()
        self.running.add(name)

    def stop(self, name: str) -> None:
        self.running.discard(name)
        self.brokers[name].stop()

    def restart(self, name: str) -> None:
        old = self.brokers[name]
        assert old.runtime is not None
        addresses = old.runtime.addresses
        listeners = tuple(dataclasses.replace(lst, port=addresses[lst.name][1])
                          for lst in old.config.listeners)
        mgmt = dataclasses.replace(old.config.management, port=old.management_port)
        self._run(name, dataclasses.replace(old.config, listeners=listeners, management=mgmt))

    def close(self) -> None:
        for name in ("A", "B", "C"):
            if name in self.running:
                self.stop(name)


@pytest.fixture
def network3(tmp_path: Path) -> Iterator[Network]:
    net = Network(tmp_path)
    try:
        yield net.start()
    finally:
        net.close()
