"""The web console in a real headless Chromium: every page loads without a browser
console error, the overview names the broker, the network map draws A -> B -> C and
follows a broker going down and coming back, and purge/move act through the pages."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.console.conftest import Network
from tests.support.brokers import ThreadBroker

PAGES = ("overview", "destinations", "connections", "subscriptions", "network", "ha")
MISSING_404 = "the server responded with a status of 404"


def route_missing(port: int, method: str, path: str) -> bool:
    """Whether the broker has no such route (aiohttp's own 404), as opposed to a 404 of
    a route that exists (no such queue)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=b"{}" if method != "GET" else None,
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10).close()
        return False
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
        return exc.code in (404, 405) and str(body.get("error", "")).startswith(
            ("no such resource", "method"))


def console_errors(driver: Any, port: int) -> list[str]:
    """SEVERE browser log entries, less the 404s of API routes this broker lacks (the
    console asks for them and shows "not available"; they vanish once they exist)."""
    errors = []
    for entry in driver.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        message = entry["message"]
        if MISSING_404 in message and "/api/" in message:
            path = message.split(" ", 1)[0].split(f":{port}", 1)[-1]
            if route_missing(port, "GET", path.split("?", 1)[0]):
                continue
        errors.append(message)
    return errors


def open_page(driver: Any, port: int, page: str) -> None:
    # Only the hash changes between pages, so nothing reloads: wait for this page's
    # render, not any page's (the previous one is still marked ready for a moment).
    # A queue's page is marked as the Destinations page it belongs to.
    shown = "destinations" if page.startswith("queue/") else page
    driver.get(f"http://127.0.0.1:{port}/console/#/{page}")
    WebDriverWait(driver, 15).until(
        lambda d: d.find_element(By.ID, "main").get_attribute("data-page") == shown
        and d.find_element(By.ID, "main").get_attribute("data-ready"))


def test_every_page_loads_without_console_errors(browser: Any, broker: ThreadBroker) -> None:
    port = broker.management_port
    for page in PAGES:
        open_page(browser, port, page)
        main = browser.find_element(By.ID, "main")
        assert main.get_attribute("data-page") == page
        assert not browser.find_elements(By.CSS_SELECTOR, "#main .error"), main.text
        assert console_errors(browser, port) == [], page


def test_the_overview_names_the_broker(browser: Any, broker: ThreadBroker) -> None:
    browser.get(f"http://127.0.0.1:{broker.management_port}/")
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "broker-name"))
    assert browser.find_element(By.ID, "broker-name").text == "test"
    assert browser.current_url.endswith("/console/")


def edge_state(driver: Any, src: str, dst: str) -> str | None:
    # Found and read in one script: the map is redrawn on every refresh, and an element
    # found by one call may be gone by the next.
    state: str | None = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return e ? e.getAttribute('data-state') : null;",
        f'#network-map g.edge[data-from="{src}"][data-to="{dst}"]')
    return state


def test_the_network_map_follows_a_broker_going_down_and_back(
        browser: Any, network3: Network) -> None:
    port = network3.brokers["A"].management_port
    open_page(browser, port, "network")
    # The map is redrawn on every refresh: an element found just before a redraw goes
    # stale, and the wait simply looks again.
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda d: [n.get_attribute("data-broker") for n in d.find_elements(
        By.CSS_SELECTOR, "#network-map g.node")] == ["A", "B", "C"])
    assert edge_state(browser, "A", "B") == "forwarding"
    assert edge_state(browser, "B", "C") == "forwarding"
    assert console_errors(browser, port) == []

    network3.stop("C")
    wait.until(lambda d: edge_state(d, "B", "C") not in (None, "forwarding"))

    def edge_to_c(d: Any) -> tuple[str, str]:
        edge = d.find_element(By.CSS_SELECTOR, '#network-map g.edge[data-to="C"]')
        return (edge.find_element(By.TAG_NAME, "title").get_attribute("textContent"),
                edge.find_element(By.CSS_SELECTOR, "text").text)

    title, label = wait.until(edge_to_c)
    assert "last error:" in title, title
    assert "forwarding" not in label
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '#network-map g.node[data-broker="C"]')
               .get_attribute("data-reachable") == "false")

    network3.restart("C")
    wait.until(lambda d: edge_state(d, "B", "C") == "forwarding")
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '#network-map g.node[data-broker="C"]')
               .get_attribute("data-reachable") == "true")


def send(broker: ThreadBroker, queue: str, count: int) -> None:
    import stomp

    conn = stomp.Connection([("127.0.0.1", broker.port)])
    conn.connect(wait=True)
    for i in range(count):
        conn.send(f"/queue/{queue}", f"message {i}")
    conn.disconnect()


def depth(broker: ThreadBroker, queue: str) -> int:
    try:
        return int(broker.destination_stats(queue)["depth"])
    except KeyError:
        return 0


def test_purge_through_the_destinations_page(browser: Any, broker: ThreadBroker) -> None:
    port = broker.management_port
    if route_missing(port, "POST", "/api/destinations/queue/probe/purge"):
        pytest.skip("POST /api/destinations/{type}/{name}/purge is not on this broker yet")
    send(broker, "orders", 3)
    open_page(browser, port, "destinations")
    button = WebDriverWait(browser, 15).until(
        lambda d: d.find_element(By.CSS_SELECTOR, 'button[data-purge="orders"]'))
    button.click()
    browser.switch_to.alert.accept()
    WebDriverWait(browser, 15).until(lambda d: depth(broker, "orders") == 0)


def test_move_through_the_queue_page(browser: Any, broker: ThreadBroker) -> None:
    port = broker.management_port
    if route_missing(port, "POST", "/api/queues/probe/move"):
        pytest.skip("POST /api/queues/{name}/move is not on this broker yet")
    send(broker, "source", 2)
    open_page(browser, port, "queue/source")
    button = WebDriverWait(browser, 15).until(lambda d: d.find_element(By.ID, "move-all"))
    button.click()
    alert = browser.switch_to.alert
    alert.send_keys("queue://target")
    alert.accept()
    WebDriverWait(browser, 15).until(lambda d: depth(broker, "target") == 2)
    assert depth(broker, "source") == 0
