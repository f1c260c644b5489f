"""Fixtures for the management UI's browser tests: Playwright for Python driving Debian's
chromium (Playwright's own browser download is not used).

MGMT_PORT (default 15672) is the broker's management HTTP port, AMQP_URL its AMQP URL,
CHROMIUM the browser (default /usr/bin/chromium). A failed test leaves a full-page
screenshot in cluster-tests/ui/failures/ (git-ignored). Every wait is bounded.
"""
import base64
import json
import os
import pathlib
import time
import urllib.error
import urllib.request

import pika
import pytest
from playwright.sync_api import sync_playwright

MGMT = f"http://127.0.0.1:{os.environ.get('MGMT_PORT', '15672')}"
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FAILURES = pathlib.Path(__file__).resolve().parent / "failures"


@pytest.fixture(scope="session")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


class Console:
    """The page's console errors and uncaught exceptions."""

    def __init__(self):
        self.errors = []

    def assert_clean(self, where=""):
        assert self.errors == [], f"console errors {where}: {self.errors}"


@pytest.fixture
def console():
    return Console()


@pytest.fixture
def page(browser, console):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.set_default_timeout(15000)
    pg.on("console", lambda m: console.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: console.errors.append(f"uncaught: {e}"))
    # Purge, delete and close ask for confirmation.
    pg.on("dialog", lambda d: d.accept())
    yield pg
    ctx.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        pg = item.funcargs.get("page")
        if pg is not None and not pg.is_closed():
            FAILURES.mkdir(exist_ok=True)
            path = FAILURES / f"{item.name}.png"
            try:
                pg.screenshot(path=str(path), full_page=True)
                print(f"screenshot of the failure: {path}")
            except Exception as e:  # the report matters more than the picture
                print(f"no screenshot: {e}")


def login(page, user="guest", password="guest"):
    """Logs in through the form (Enter submits) and waits for the app to show."""
    page.goto(MGMT + "/")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.press("input[name=password]", "Enter")
    page.wait_for_selector("#app:not([hidden])")


def goto(page, console, hash_):
    """Opens the page at `hash_`, waits for its first data refresh, and checks that it
    logged no console error."""
    page.goto(f"{MGMT}/{hash_}")
    page.wait_for_function("document.body.dataset.refreshed !== undefined")
    console.assert_clean(hash_)


def api(method, path, body=None, user="guest", password="guest"):
    """Calls the management API; (status, JSON or None)."""
    req = urllib.request.Request(MGMT + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text else None


def eventually(what, fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.2)


@pytest.fixture
def amqp():
    params = pika.URLParameters(AMQP_URL)
    params.socket_timeout = 10
    c = pika.BlockingConnection(params)
    yield c
    if c.is_open:
        c.close()


def depth(ch, queue):
    return ch.queue_declare(queue, passive=True).method.message_count
