"""Every panel query of RabbitMQ's Grafana dashboards, and every expression of
quorumq's dead-letter dashboard, returns data from a real Prometheus scraping a 3-node
quorumq cluster under load (issue 30 item 4).

The test starts three quorumq nodes (one quorum-queue cluster, fresh data dirs, free
ports), runs a load on all three (confirmed publishes of several sizes, consumers with
manual and automatic acks, basic.get with and without ack and on an empty queue,
rejects, nacks over a delivery limit with delayed retry, TTL expiry and max-length
dead-lettering, dead letters held for want of a route, unroutable publishes dropped and
returned, connection/channel/queue churn, a redrive), starts Debian's `prometheus`
scraping the nodes' `/metrics` every second, and then evaluates

- `dashboard_queries.py`: quorumq's own list of one query per panel (per series where
  a panel draws several families) of RabbitMQ's RabbitMQ-Overview and
  RabbitMQ-Quorum-Queues-Raft dashboards (RabbitMQ's JSON is not in this repository;
  see that file),
- every `expr` of every panel target of deploy/grafana/quorumq-dead-letters.json,
- when $RABBITMQ_DASHBOARDS_DIR names a directory holding RabbitMQ's
  RabbitMQ-Overview.json and RabbitMQ-Quorum-Queues-Raft.json (from rabbitmq-server's
  deps/rabbitmq_prometheus/docker/grafana/dashboards/), every `expr` of every panel
  target of those too, as they are; and then `dashboard_queries.py` must have an entry
  for each of their titled panels,

through Prometheus's HTTP API (`/api/v1/query`), with Grafana's variables substituted as
Grafana would (the template queries `label_values(...)` for `$namespace`,
`$rabbitmq_cluster` and `$endpoint`; `$__rate_interval` = 4 x the scrape interval;
`$__range` = the time the load has run). Each must return at least one series with a
finite value. A table `expr -> series` is printed (pytest -s shows it).

Binary: $QUORUMQ_BIN, else <workspace>/target/debug/quorumq. Prometheus: $PROMETHEUS,
else `prometheus` on PATH.
"""
import base64
import json
import logging
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import pika
import pytest

import dashboard_queries

# Returned mandatory publishes are the load's intent; pika logs each one.
logging.getLogger("pika").setLevel(logging.ERROR)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("QUORUMQ_BIN", os.path.join(ROOT, "target", "debug", "quorumq"))
PROMETHEUS = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
# Dashboards whose JSON this repository holds: every expr is evaluated.
OWN_DASHBOARDS = ["deploy/grafana/quorumq-dead-letters.json"]
# RabbitMQ's, evaluated as they are when $RABBITMQ_DASHBOARDS_DIR holds them.
RABBITMQ_DASHBOARDS_DIR = os.environ.get("RABBITMQ_DASHBOARDS_DIR")
NAMESPACE = "quorumq-test"
SCRAPE_S = 1
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 x scrape interval).
RATE_INTERVAL = f"{4 * SCRAPE_S}s"
LOAD_S = 30  # load before the queries (and $__range)
NODES = 3


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(url, body=None, method=None, timeout=30):
    req = urllib.request.Request(url, data=body, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    if body is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def connect(port):
    params = pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
        socket_timeout=10, blocked_connection_timeout=30, heartbeat=30)
    return pika.BlockingConnection(params)


class Cluster:
    """Three quorumq nodes on free ports in `work`."""

    def __init__(self, work):
        self.work = work
        self.amqp = [free_port() for _ in range(NODES)]
        self.http = [free_port() for _ in range(NODES)]
        self.cluster = [free_port() for _ in range(NODES)]
        peers = ",".join(f"{i + 1}=127.0.0.1:{self.cluster[i]}" for i in range(NODES))
        self.procs = []
        for i in range(NODES):
            log = open(os.path.join(work, f"node-{i + 1}.log"), "wb")
            self.procs.append(subprocess.Popen(
                [BIN, "--node-id", str(i + 1), "--amqp-listen", f"127.0.0.1:{self.amqp[i]}",
                 "--cluster-listen", f"127.0.0.1:{self.cluster[i]}",
                 "--http-listen", f"127.0.0.1:{self.http[i]}",
                 "--data-dir", os.path.join(work, f"node-{i + 1}"), "--peers", peers],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"}))

    def wait_ready(self, timeout=90):
        deadline = time.monotonic() + timeout
        for i in range(NODES):
            log = os.path.join(self.work, f"node-{i + 1}.log")
            while True:
                assert self.procs[i].poll() is None, f"node {i + 1} exited: {self.tail(i)}"
                with open(log, "rb") as f:
                    if b"quorumq ready" in f.read():
                        break
                assert time.monotonic() < deadline, f"node {i + 1} not ready: {self.tail(i)}"
                time.sleep(0.2)

    def tail(self, i):
        with open(os.path.join(self.work, f"node-{i + 1}.log"), "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


QQ = {"x-queue-type": "quorum"}
QUEUES = {
    # Consumed with manual acks; "reject" bodies are rejected (dead-lettered at least
    # once to dlq), "poison" bodies nacked with requeue (delayed retry, then
    # dead-lettered over the delivery limit).
    "work": {**QQ, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq",
             "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
             "x-delivery-limit": 2, "x-delayed-retry-type": "failed",
             "x-delayed-retry-min": 100},
    "dlq": QQ,
    "parking": QQ,
    # Expire (at most once to dlq).
    "ttl": {**QQ, "x-message-ttl": 50, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dlq"},
    # Over max-length: the head is dead-lettered.
    "capped": {**QQ, "x-max-length": 5, "x-dead-letter-exchange": "",
               "x-dead-letter-routing-key": "dlq"},
    # At-least-once to an exchange that does not exist: its dead letters are held.
    "held": {**QQ, "x-dead-letter-exchange": "no.such.exchange",
             "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"},
    "auto": QQ,
    "polled": QQ,
}
SIZES = [50, 500, 5_000, 50_000]


class Load:
    """Threads driving the cluster until `stop` is set; errors are collected."""

    def __init__(self, cluster):
        self.c = cluster
        self.stop = threading.Event()
        self.errors = []
        self.counts = {}
        self.threads = []

    def run(self, name, fn):
        def body():
            n = 0
            try:
                n = fn()
            except Exception as e:  # reported by the test, not swallowed
                if not self.stop.is_set():
                    self.errors.append(f"{name}: {e!r}")
            self.counts[name] = n
        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def publisher(self, node):
        def fn():
            conn = connect(self.c.amqp[node])
            ch = conn.channel()
            ch.confirm_delivery()
            n = 0
            while not self.stop.is_set():
                size = SIZES[n % len(SIZES)]
                kind = ("reject" if n % 10 == 3 else "poison" if n % 25 == 7 else "ok")
                body = kind.encode().ljust(size, b".")
                ch.basic_publish("", "work", body)
                if n % 5 == 0:
                    ch.basic_publish("", "ttl", b"t" * 100)
                    ch.basic_publish("", "capped", b"c" * 100)
                    ch.basic_publish("", "auto", b"a" * 100)
                    ch.basic_publish("", "polled", b"p" * 100)
                n += 1
                time.sleep(0.01)
            conn.close()
            return n
        self.run(f"publisher-{node + 1}", fn)

    def consumer(self, node):
        def fn():
            conn = connect(self.c.amqp[node])
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)
            n = 0
            for method, _props, body in ch.consume("work", inactivity_timeout=0.2):
                if self.stop.is_set():
                    break
                if method is None:
                    continue
                if body.startswith(b"reject"):
                    ch.basic_reject(method.delivery_tag, requeue=False)
                elif body.startswith(b"poison"):
                    ch.basic_nack(method.delivery_tag, requeue=True)
                else:
                    ch.basic_ack(method.delivery_tag)
                n += 1
            ch.cancel()
            conn.close()
            return n
        self.run(f"consumer-{node + 1}", fn)

    def auto_consumer(self, node):
        def fn():
            conn = connect(self.c.amqp[node])
            ch = conn.channel()
            n = 0
            for method, _p, _b in ch.consume("auto", auto_ack=True, inactivity_timeout=0.2):
                if self.stop.is_set():
                    break
                n += method is not None
            ch.cancel()
            conn.close()
            return n
        self.run(f"auto-consumer-{node + 1}", fn)

    def misc(self, node):
        """basic.get (auto ack, manual ack, empty), unroutable publishes (dropped and
        returned), dead letters held, churn of connections, channels and queues, and a
        redrive of dlq into parking every few seconds."""
        def fn():
            conn = connect(self.c.amqp[node])
            ch = conn.channel()
            ch.confirm_delivery()
            n = 0
            last_churn = last_redrive = 0.0
            while not self.stop.is_set():
                ch.basic_get("polled", auto_ack=True)
                m, _p, _b = ch.basic_get("polled", auto_ack=False)
                if m is not None:
                    ch.basic_ack(m.delivery_tag)
                ch.basic_get("parking.empty", auto_ack=True)
                ch.basic_publish("", "no.such.queue", b"u")
                try:
                    ch.basic_publish("", "no.such.queue", b"u", mandatory=True)
                except pika.exceptions.UnroutableError:
                    pass
                ch.basic_publish("", "held", b"h")
                m, _p, _b = ch.basic_get("held", auto_ack=False)
                if m is not None:
                    ch.basic_reject(m.delivery_tag, requeue=False)
                now = time.monotonic()
                if now - last_churn > 2:
                    last_churn = now
                    c2 = connect(self.c.amqp[(node + 1) % NODES])
                    ch2 = c2.channel()
                    q = f"churn-{node}-{n}"
                    ch2.queue_declare(q, durable=True, arguments=QQ)
                    ch2.queue_delete(q)
                    c2.close()
                if now - last_redrive > 5:
                    last_redrive = now
                    http(f"http://127.0.0.1:{self.c.http[node]}/api/queues/%2F/dlq/redrive",
                         json.dumps({"to": "parking", "max": 20}).encode(), "POST", timeout=60)
                n += 1
                time.sleep(0.05)
            conn.close()
            return n
        self.run(f"misc-{node + 1}", fn)


def write_prometheus_config(work, cluster):
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in cluster.http)
    path = os.path.join(work, "prometheus.yml")
    with open(path, "w") as f:
        f.write(f"""global:
  scrape_interval: {SCRAPE_S}s
  scrape_timeout: {SCRAPE_S}s
  evaluation_interval: {SCRAPE_S}s
scrape_configs:
  - job_name: quorumq
    metrics_path: /metrics
    static_configs:
      - targets: [{targets}]
        labels:
          namespace: {NAMESPACE}
""")
    return path


class Prometheus:
    def __init__(self, work, config):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(work, "prometheus.log"), "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(url, timeout=30) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def wait_up(self, n, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "prometheus exited"
            try:
                r = self.query('sum(up{job="quorumq"})')
                if r and float(r[0]["value"][1]) == n:
                    return
            except (OSError, AssertionError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"prometheus does not see {n} targets up")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def label_values(prom, query):
    """Grafana's `label_values(METRIC{...}, LABEL)`: sorted values of LABEL."""
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip(), re.S)
    assert m, query
    series = prom.api("series", **{"match[]": m.group(1)})
    return sorted({s[m.group(2)] for s in series if m.group(2) in s})


def targets(dashboard):
    """(panel title, expr) of every target of every panel, rows included."""
    out = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr") and not t.get("hide"):
                    out.append((p.get("title") or f"panel {p.get('id')}", t["expr"]))
    walk(dashboard["panels"])
    return out


def panel_titles(dashboard):
    """Titles of every panel that is not a row (untitled panels left out)."""
    out = set()

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            if p.get("type") != "row" and p.get("title"):
                out.add(p["title"])
    walk(dashboard["panels"])
    return out


def template_variables(dashboard):
    """(name, query) of the dashboard's query variables, as they are listed."""
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            out.append((v["name"], v["query"]["query"] if isinstance(v["query"], dict)
                        else v["query"]))
    return out


def expressions():
    """(source, panel, expr, variable queries) of everything the test evaluates: the
    per-panel list of dashboard_queries.py, every expr of quorumq's own dashboards, and
    (with $RABBITMQ_DASHBOARDS_DIR) every expr of RabbitMQ's dashboards, each of whose
    titled panels must then have an entry in the per-panel list."""
    out = []
    for name, entries in dashboard_queries.DASHBOARDS.items():
        for title, series, expr in entries:
            panel = (title or "(untitled)") + (f" [{series}]" if series else "")
            out.append((f"ours:{name}", panel, expr, dashboard_queries.VARIABLES))
    for path in OWN_DASHBOARDS:
        with open(os.path.join(ROOT, path)) as f:
            dashboard = json.load(f)
        out += [(os.path.basename(path), title, expr, template_variables(dashboard))
                for title, expr in targets(dashboard)]
    if RABBITMQ_DASHBOARDS_DIR:
        for name, entries in dashboard_queries.DASHBOARDS.items():
            path = os.path.join(RABBITMQ_DASHBOARDS_DIR, f"{name}.json")
            assert os.path.isfile(path), f"RABBITMQ_DASHBOARDS_DIR has no {name}.json"
            with open(path) as f:
                dashboard = json.load(f)
            missing = panel_titles(dashboard) - {title for title, _s, _e in entries}
            assert not missing, f"dashboard_queries.py lacks panels of {name}: {missing}"
            out += [(os.path.basename(path), title, expr, template_variables(dashboard))
                    for title, expr in targets(dashboard)]
    return out


def substitute(expr, variables):
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def resolve(prom, queries, range_s):
    """Grafana's variables for a dashboard with the query variables `queries` ((name,
    query) pairs): each once the variables its query names are known (Grafana orders
    them by dependency), the first of its sorted values (the dashboards' `current` is
    empty: Grafana picks the first); then the built-in interval variables."""
    pending = dict(queries)
    variables = {}
    while pending:
        ready = [n for n, q in pending.items()
                 if all(m in variables for m in re.findall(r"\$\{?(\w+)", q))]
        assert ready, f"variables with unresolvable references: {pending}"
        for name in ready:
            values = label_values(prom, substitute(pending.pop(name), variables))
            assert values, f"variable {name} has no values"
            variables[name] = values[0]
    variables.update({
        "__rate_interval": RATE_INTERVAL,
        "__interval": f"{SCRAPE_S}s",
        "__range": f"{range_s}s",
    })
    return variables


@pytest.fixture
def work():
    d = tempfile.mkdtemp(prefix="quorumq-prom-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_every_dashboard_expr_returns_data(work):
    assert PROMETHEUS, "prometheus not installed (apt-get install prometheus)"
    assert os.access(BIN, os.X_OK), f"no quorumq binary at {BIN}"
    exprs = expressions()  # before the cluster: a bad RABBITMQ_DASHBOARDS_DIR fails fast
    cluster = Cluster(work)
    prom = load = None
    try:
        cluster.wait_ready()
        conn = connect(cluster.amqp[0])
        ch = conn.channel()
        for q, args in QUEUES.items():
            ch.queue_declare(q, durable=True, arguments=args)
        ch.queue_declare("parking.empty", durable=True, arguments=QQ)
        conn.close()
        prom = Prometheus(work, write_prometheus_config(work, cluster))
        prom.wait_up(NODES)
        load = Load(cluster)
        started = time.monotonic()
        for node in range(NODES):
            load.publisher(node)
            load.consumer(node)
            load.misc(node)
        load.auto_consumer(2)
        time.sleep(LOAD_S)
        assert not load.errors, load.errors
        range_s = int(time.monotonic() - started)

        rows, empty, resolved = [], [], {}
        for source, title, expr, queries in exprs:
            key = tuple(queries)
            if key not in resolved:
                resolved[key] = resolve(prom, queries, range_s)
            result = prom.query(substitute(expr, resolved[key]))
            finite = [r for r in result if math.isfinite(float(r["value"][1]))]
            sample = finite[0]["value"][1] if finite else "-"
            rows.append((source, title, len(result), len(finite), sample,
                         " ".join(expr.split())))
            if not finite:
                empty.append((source, title, expr))
        print(f"\n{'dashboard':<36} {'panel':<56} series finite sample  expr")
        for d, title, n, nf, sample, expr in rows:
            print(f"{d:<36} {title[:56]:<56} {n:>6} {nf:>6} {str(sample)[:7]:<7} {expr[:160]}")
        per_source = {}
        for d, *_ in rows:
            per_source[d] = per_source.get(d, 0) + 1
        print(f"expressions per source: {per_source}; without data: {len(empty)}")
        assert not empty, "expressions without data:\n" + "\n".join(
            f"{p} / {t}: {e}" for p, t, e in empty)
        # 50 + 8 of ours for RabbitMQ's panels and 17 of quorumq-dead-letters.json; with
        # RabbitMQ's JSON, theirs too (50 + 8 in rabbitmq-server 5b09e556).
        assert len(rows) >= 75, f"only {len(rows)} expressions found"
        if RABBITMQ_DASHBOARDS_DIR:
            for name in dashboard_queries.DASHBOARDS:
                assert per_source.get(f"{name}.json"), f"no expressions in {name}.json"
        # The load produced what the rarer panels chart, not just zeros.
        produced = {
            "reasons": 'sum by(reason) (quorumq_queue_messages_dead_lettered_total) > 0',
            "redriven": 'sum(quorumq_dead_letters_redriven_total) > 0',
            "held no_route": 'sum(quorumq_queue_dead_letters_held{reason="no_route"}) > 0',
            "dead letters confirmed": 'sum(rabbitmq_global_messages_dead_lettered_confirmed_total) > 0',
            "returned": 'sum(rabbitmq_global_messages_unroutable_returned_total) > 0',
            "auto-ack consumed": 'sum(rabbitmq_global_messages_delivered_consume_auto_ack_total) > 0',
            "over 10 kB": 'sum(rabbitmq_message_size_bytes_count) - sum(rabbitmq_message_size_bytes_bucket{le="10000.0"}) > 0',
            "elections": 'count(rabbitmq_raft_term) > 0',
        }
        for what, expr in produced.items():
            result = prom.query(expr)
            assert result, f"the load produced no {what}: {expr}"
        reasons = {r["metric"]["reason"] for r in prom.query(produced["reasons"])}
        assert reasons == {"rejected", "expired", "maxlen", "delivery_limit"}, reasons
    finally:
        if load:
            load.join()
            print(f"load (operations per thread): {load.counts}")
        if prom:
            prom.stop()
        cluster.stop()
    assert not load.errors, load.errors
