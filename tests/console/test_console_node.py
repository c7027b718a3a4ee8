"""The web console of a node of two shards (real ``meshmq broker --shards 2``
processes) in a real headless Chromium: the node serves the console itself, every page
loads without a browser error, the overview shows the node's sums, and the Shards page
lists each shard and link, follows a shard killed with SIGKILL and restarted without a
reload, and adds up to the node's totals."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.console.test_console_pages import PAGES, console_errors, open_page
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.nodes import NodeProcess, plain_module_node, stomp_on

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    yield from plain_module_node(tmp_path_factory.mktemp("node"))


@pytest.fixture(scope="module")
def clients(node: NodeProcess) -> Iterator[list[RawClient]]:
    """A client on each shard, each sending to a queue: both shards have figures."""
    opened = [stomp_on(node, k) for k in (0, 1)]
    try:
        for k, client in enumerate(opened):
            client.send_frame("SEND", [("destination", f"/queue/console.{k}"),
                                       ("persistent", "true"), ("receipt", f"r{k}")], b"m")
            client.read_until_receipt(f"r{k}")
        yield opened
    finally:
        for client in opened:
            client.close()


# Read in one script, so that the page's refresh (every 2 s) cannot replace the
# elements between two reads.
_CELLS = """
const out = {};
for (const tr of document.querySelectorAll('#' + arguments[0] + ' tbody tr')) {
  const row = {};
  for (const td of tr.querySelectorAll('td')) row[td.getAttribute('data-col')] =
      td.innerText.trim();
  out[tr.getAttribute('data-key')] = row;
}
return out;
"""
_CARDS = """
const out = {};
for (const card of document.querySelectorAll(arguments[0] + ' .card')) {
  const label = card.querySelector('.label'), value = card.querySelector('.value');
  if (label && value) out[label.innerText.trim()] = value.innerText.trim();
}
return out;
"""


def cells(driver: Any, table: str) -> dict[str, dict[str, str]]:
    """A table's rows by key, each its cells by column."""
    rows: dict[str, dict[str, str]] = driver.execute_script(_CELLS, table)
    return rows


def cards(driver: Any, where: str) -> dict[str, str]:
    """The value of each summary card under ``where`` (a CSS selector), by label."""
    values: dict[str, str] = driver.execute_script(_CARDS, where)
    return values


def test_every_page_of_the_nodes_console_loads_without_errors(
        browser: Any, node: NodeProcess, clients: list[RawClient]) -> None:
    port = node.ports["management"]
    for page in (*PAGES, "shards"):
        open_page(browser, port, page)
        main = browser.find_element(By.ID, "main")
        assert main.get_attribute("data-page") == page
        assert not browser.find_elements(By.CSS_SELECTOR, "#main .error"), main.text
        assert console_errors(browser, port) == [], page
    # The node says what it is and offers its Shards page.
    assert browser.find_element(By.ID, "broker-badge").text == "node node (2 shards)"
    assert browser.find_element(By.ID, "nav-shards").is_displayed()


def test_the_overview_shows_the_nodes_sums(browser: Any, node: NodeProcess,
                                           clients: list[RawClient]) -> None:
    open_page(browser, node.ports["management"], "overview")
    figures = cards(browser, "#main")
    broker = node.api("/api/broker")
    assert broker["connections"] == 2  # one on each shard
    assert figures["Connections"] == "2"
    assert figures["Destinations"] == "2"  # console.0 and console.1, on their owners
    assert figures["Enqueued"] == "2"
    assert figures["Shards"] == "2 of 2 up"


def test_the_shards_page_lists_shards_and_links_and_follows_a_restart(
        browser: Any, node: NodeProcess, clients: list[RawClient]) -> None:
    port = node.ports["management"]
    open_page(browser, port, "shards")
    doc = node.api("/api/shards")
    shown = cells(browser, "shard-table")
    assert set(shown) == {"0", "1"}
    for row in doc["shards"]:
        mine = shown[str(row["shard"])]
        assert mine["state"] == "running" and mine["pid"] == str(row["pid"])
        assert mine["restarts"] == "0" and mine["connections"] == "1"
    assert sum(int(r["destinations"]) for r in shown.values()) == 2
    assert sum(int(r["messages_in"]) for r in shown.values()) == 2
    links = cells(browser, "link-table")
    assert set(links) == {"0->1", "1->0"} and all(r["up"] == "yes" for r in links.values())
    totals = cards(browser, "#shard-totals")
    assert totals["Shards running"] == "2 of 2"
    assert totals["Connections"] == "2" and totals["Destinations"] == "2"
    # Shard 1 killed: the open page shows its restart without a reload, and the
    # console keeps answering (the node serves it, whatever shard is down).
    victim = doc["shards"][1]["pid"]
    os.kill(victim, signal.SIGKILL)

    def restarted() -> bool:
        row = cells(browser, "shard-table").get("1") or {}
        return row.get("restarts") == "1" and row.get("state") == "running" \
            and (row.get("pid") or "").isdigit() and row.get("pid") != str(victim)

    WebDriverWait(browser, 30, ignored_exceptions=(Exception,)).until(
        lambda d: restarted())
    assert browser.find_element(By.ID, "main").get_attribute("data-page") == "shards"
    poll(lambda: node.shards()[1]["pid"] != victim, 10, "the node to list the new pid")
    assert console_errors(browser, port) == []
