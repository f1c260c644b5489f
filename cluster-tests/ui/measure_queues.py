"""Measures the management UI's queue list with 1,000 queues (issue 30: "the queue list
renders and filters in under 1 s"). Prints numbers; asserts nothing about time.

    cluster-tests/compat/with-quorumq.sh python3 cluster-tests/ui/measure_queues.py

Declares N (default 1000, argv[1]) quorum queues perf.0000..., logs in with Debian's
chromium, then times in the page (performance.now()):
- render: from opening #/queues to its first page (100 rows) drawn, counting 1,000;
- filter: from a keystroke in the filter box to the matching rows drawn (this includes
  the UI's 150 ms typing debounce), for a filter matching 100 and one matching 10;
- overview: from opening #/ to its data drawn (it reads every queue's leader and members);
- the API call alone: GET /api/queues?page=1&page_size=100&name=...&columns=....
"""
import os
import statistics
import sys
import time
import urllib.request
import base64

import pika
from playwright.sync_api import sync_playwright

MGMT = f"http://127.0.0.1:{os.environ.get('MGMT_PORT', '15672')}"
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
RUNS = 5

RENDER = """async (total) => {
  const t0 = performance.now();
  location.hash = '#/queues';
  await new Promise((res) => {
    const check = () => {
      const rows = document.querySelectorAll('#queue-list tbody tr').length;
      const count = document.querySelector('#queue-count');
      if (rows === Math.min(100, total) && count && count.textContent.includes(total.toLocaleString('en-US') + ' queues')) res();
      else requestAnimationFrame(check);
    };
    check();
  });
  return performance.now() - t0;
}"""

OVERVIEW = """async () => {
  const t0 = performance.now();
  location.hash = '#/';
  await new Promise((res) => {
    const check = () => (document.body.dataset.refreshed !== undefined && document.querySelector('[data-total]'))
      ? res() : requestAnimationFrame(check);
    check();
  });
  return performance.now() - t0;
}"""

FILTER = """async ([text, rows, first]) => {
  const f = document.querySelector('#queue-filter');
  const t0 = performance.now();
  f.value = text;
  f.dispatchEvent(new Event('input'));
  await new Promise((res) => {
    const check = () => {
      const trs = document.querySelectorAll('#queue-list tbody tr');
      const cell = trs.length && trs[0].querySelector('td:nth-child(2)');
      if (trs.length === rows && cell && cell.textContent === first) res();
      else requestAnimationFrame(check);
    };
    check();
  });
  return performance.now() - t0;
}"""


def summary(xs):
    return f"median {statistics.median(xs):.0f} ms, max {max(xs):.0f} ms ({len(xs)} runs)"


def main():
    c = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = c.channel()
    t = time.monotonic()
    for i in range(N):
        ch.queue_declare(f"perf.{i:04}", durable=True, arguments={"x-queue-type": "quorum"})
    print(f"declared {N} quorum queues in {time.monotonic() - t:.1f} s")
    for i in range(0, N, 10):
        ch.basic_publish("", f"perf.{i:04}", b"x")
    c.close()

    auth = "Basic " + base64.b64encode(b"guest:guest").decode()
    api = []
    for _ in range(RUNS):
        req = urllib.request.Request(
            f"{MGMT}/api/queues?page=1&page_size=100&name=perf.09&use_regex=false&columns=name,vhost,"
            "type,leader,members,online,state,messages,messages_ready,messages_unacknowledged,"
            "messages_dlx,messages_delayed,consumers,message_stats")
        req.add_header("Authorization", auth)
        t = time.monotonic()
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
        api.append((time.monotonic() - t) * 1000)
    print(f"API page of 100 (filtered):   {summary(api)}")

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        page = b.new_page(viewport={"width": 1280, "height": 800})
        page.goto(MGMT + "/")
        page.fill("input[name=username]", "guest")
        page.fill("input[name=password]", "guest")
        page.press("input[name=password]", "Enter")
        page.wait_for_selector("#app:not([hidden])")
        render, filter100, filter10, overview = [], [], [], []
        for _ in range(RUNS):
            page.evaluate("location.hash = '#/nodes'")
            page.wait_for_function("document.body.dataset.refreshed !== undefined")
            render.append(page.evaluate(RENDER, N))
            filter100.append(page.evaluate(FILTER, ["perf.09", 100, "perf.0900"]))
            filter10.append(page.evaluate(FILTER, ["perf.012", 10, "perf.0120"]))
            page.evaluate(FILTER, ["", min(100, N), "perf.0000"])
            overview.append(page.evaluate(OVERVIEW))
        b.close()
    print(f"queue list render ({N} queues, first page of 100): {summary(render)}")
    print(f"filter to 100 rows (incl. 150 ms debounce):     {summary(filter100)}")
    print(f"filter to 10 rows (incl. 150 ms debounce):      {summary(filter10)}")
    print(f"overview (totals, nodes' leaders/members of all {N}): {summary(overview)}")


if __name__ == "__main__":
    main()
