"""Saves a screenshot (1280x800) of every page of the management UI to docs/screenshots/.

Run against a fresh quorumq (it declares a few queues, a policy and a consumer, and
publishes for a while so the rate charts have something to show):

    cluster-tests/compat/with-quorumq.sh python3 cluster-tests/ui/screenshots.py

MGMT_PORT (default 15672) is the management HTTP port, AMQP_URL the AMQP URL; the
browser is Debian's chromium (CHROMIUM, default /usr/bin/chromium).
"""
import os
import pathlib
import threading
import time

import pika
from playwright.sync_api import sync_playwright

MGMT = f"http://127.0.0.1:{os.environ.get('MGMT_PORT', '15672')}"
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
OUT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "screenshots"

PAGES = [
    ("overview", "#/"),
    ("queues", "#/queues"),
    ("queue", "#/queues/%2F/orders.dlq"),
    ("exchanges", "#/exchanges"),
    ("exchange", "#/exchanges/%2F/orders"),
    ("connections", "#/connections"),
    ("channels", "#/channels"),
    ("cluster", "#/nodes"),
    ("policies", "#/policies"),
    ("users", "#/users"),
    ("vhosts", "#/vhosts"),
]


def setup():
    """Queues with a dead-letter queue holding rejected messages, a binding, a policy."""
    c = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = c.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    ch.queue_declare("orders.dlq", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare("orders", durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders.dlq"})
    ch.queue_bind("orders", "orders", "order.#")
    for i in range(20):
        ch.queue_declare(f"work.{i:02}", durable=True, arguments={"x-queue-type": "quorum"})
    for i in range(12):
        ch.basic_publish("orders", "order.created", f'{{"order": {i}}}'.encode(),
                         pika.BasicProperties(content_type="application/json", delivery_mode=2))
    for i in range(7):
        m, _, _ = ch.basic_get("orders")
        ch.basic_reject(m.delivery_tag, requeue=False)
    c.close()


def traffic(stop):
    """Publishes to and consumes from work.* until `stop` is set (for the rate charts)."""
    c = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = c.channel()
    ch.basic_qos(prefetch_count=50)
    ch.basic_consume("work.00", lambda ch, m, p, b: ch.basic_ack(m.delivery_tag))
    i = 0
    while not stop.is_set():
        for _ in range(20):
            ch.basic_publish("", f"work.{i % 20:02}", b"x" * 100)
            i += 1
        c.process_data_events(time_limit=0.05)
    c.close()


def main():
    setup()
    OUT.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    t = threading.Thread(target=traffic, args=(stop,), daemon=True)
    t.start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(MGMT + "/")
            page.fill("input[name=username]", "guest")
            page.fill("input[name=password]", "guest")
            page.press("input[name=password]", "Enter")
            page.wait_for_selector("#app:not([hidden])")
            # Two samples of the server's 5 s rates and a few chart points.
            page.wait_for_timeout(16000)
            for name, hash_ in PAGES:
                page.goto(f"{MGMT}/{hash_}")
                page.wait_for_function("document.body.dataset.refreshed")
                if name in ("overview", "queue", "exchange"):
                    page.wait_for_timeout(11000)  # a few points on the charts
                else:
                    page.wait_for_timeout(300)
                shots = [(name, None)]
                if name == "queue":
                    shots.append(("queue-dead-letters", "Dead letters"))
                for shot, heading in shots:
                    if heading:
                        page.evaluate("(t) => [...document.querySelectorAll('h2')]"
                                      ".find((h) => h.textContent === t).scrollIntoView()", heading)
                    path = OUT / f"{shot}.png"
                    page.screenshot(path=str(path))
                    print(f"{path} {path.stat().st_size} bytes")
            browser.close()
    finally:
        stop.set()
        t.join(timeout=10)


if __name__ == "__main__":
    main()
