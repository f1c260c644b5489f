"""rabbitmqadmin (Debian's /usr/bin/rabbitmqadmin, RabbitMQ 3.10.8's) against a broker's
management HTTP API: the everyday operator commands, with the outputs RabbitMQ 3.10.8
gives (recorded by hand against the installed 3.10.8; this file passes against it too).

MGMT_PORT (default 15672) is the broker's HTTP port, AMQP_URL (default
amqp://guest:guest@127.0.0.1:5672/%2f) its AMQP URL. Every command is bounded in time.
RabbitMQ's queue statistics lag up to 5 s, so counts are polled with a deadline.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid

import pika
import pytest

MGMT_PORT = os.environ.get("MGMT_PORT", "15672")
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
ADMIN = shutil.which("rabbitmqadmin") or "/usr/bin/rabbitmqadmin"

pytestmark = pytest.mark.skipif(
    not os.path.exists(ADMIN), reason="rabbitmqadmin is not installed"
)


def admin(*args, ok=True):
    """Runs rabbitmqadmin against the broker; (exit code, stdout + stderr)."""
    p = subprocess.run(
        [ADMIN, "-H", "127.0.0.1", "-P", MGMT_PORT, "-u", "guest", "-p", "guest", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    out = p.stdout + p.stderr
    if ok:
        assert p.returncode == 0, f"rabbitmqadmin {args}: {p.returncode}\n{out}"
    return p.returncode, out


def admin_json(*args):
    return json.loads(admin("-f", "raw_json", *args)[1])


def eventually(what, fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.25)


def name(prefix):
    return f"adm.{prefix}.{uuid.uuid4().hex[:8]}"


def messages(q):
    for item in admin_json("list", "queues", "name", "messages"):
        if item["name"] == q:
            return item.get("messages")
    return None


def test_declare_publish_get_in_every_ackmode_purge_and_delete():
    q, x = name("q"), name("x")
    assert admin("declare", "queue", f"name={q}", "durable=true",
                 'arguments={"x-queue-type":"quorum"}')[1].strip() == "queue declared"
    assert admin("declare", "exchange", f"name={x}", "type=direct")[1].strip() == "exchange declared"
    assert admin("declare", "binding", f"source={x}", f"destination={q}",
                 "routing_key=k")[1].strip() == "binding declared"
    assert q in [i["name"] for i in admin_json("list", "queues")]
    assert x in [i["name"] for i in admin_json("list", "exchanges")]
    bindings = [b for b in admin_json("list", "bindings") if b["source"] == x]
    assert [(b["destination"], b["routing_key"], b["properties_key"]) for b in bindings] == [(q, "k", "k")]

    for p in ("m1", "m2", "m3"):
        assert admin("publish", f"exchange={x}", "routing_key=k", f"payload={p}")[1].strip() == "Message published"
    assert admin("publish", "exchange=amq.default", "routing_key=nowhere.at.all",
                 "payload=x")[1].strip() == "Message published but NOT routed"
    eventually("3 messages", lambda: messages(q) == 3)

    got = admin_json("get", f"queue={q}", "ackmode=ack_requeue_true")
    assert [(m["payload"], m["redelivered"], m["exchange"], m["routing_key"], m["message_count"],
             m["payload_encoding"], m["payload_bytes"]) for m in got] == [("m1", False, x, "k", 2, "string", 2)]
    got = admin_json("get", f"queue={q}", "count=2", "ackmode=reject_requeue_true")
    assert [m["payload"] for m in got] == ["m1", "m2"]
    assert got[0]["redelivered"] is True
    assert got[0]["properties"]["headers"]["x-delivery-count"] == 1
    got = admin_json("get", f"queue={q}", "ackmode=ack_requeue_false")
    assert len(got) == 1
    eventually("2 left after ack_requeue_false", lambda: messages(q) == 2)
    got = admin_json("get", f"queue={q}", "ackmode=reject_requeue_false")
    assert len(got) == 1
    eventually("1 left after reject_requeue_false", lambda: messages(q) == 1)
    # The table form prints the same columns as RabbitMQ's.
    table = admin("get", f"queue={q}", "ackmode=ack_requeue_true")[1]
    header = [c.strip() for c in table.splitlines()[1].split("|")[1:-1]]
    assert header == ["routing_key", "exchange", "message_count", "payload", "payload_bytes",
                      "payload_encoding", "redelivered"], table

    assert admin("purge", "queue", f"name={q}")[1].strip() == "queue purged"
    eventually("purged", lambda: messages(q) == 0)

    assert admin("delete", "binding", f"source={x}", "destination_type=queue",
                 f"destination={q}", "properties_key=k")[1].strip() == "binding deleted"
    assert [b for b in admin_json("list", "bindings") if b["source"] == x] == []
    assert admin("delete", "exchange", f"name={x}")[1].strip() == "exchange deleted"
    rc, out = admin("delete", "exchange", f"name={x}", ok=False)
    assert rc != 0 and f"*** Not found: /api/exchanges/%2F/{x}" in out
    assert admin("delete", "queue", f"name={q}")[1].strip() == "queue deleted"


def test_connections_channels_and_consumers_are_listed_and_closed():
    q = name("cq")
    params = pika.URLParameters(AMQP_URL)
    params.client_properties = {"connection_name": q}
    params.socket_timeout = 10
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
        ch.basic_qos(prefetch_count=5)
        ch.basic_consume(q, lambda *a: None, consumer_tag=f"tag-{q}")

        def ours():
            for c in admin_json("list", "connections"):
                if c.get("user_provided_name") == q:
                    return c
            return None
        c = eventually("the connection is listed", ours)
        assert c["user"] == "guest" and c["vhost"] == "/" and c["state"] == "running"
        assert c["name"] == f"{c['peer_host']}:{c['peer_port']} -> {c['host']}:{c['port']}"
        assert c["client_properties"]["product"] == "Pika Python Client Library"

        def our_channel():
            return [x for x in admin_json("list", "channels")
                    if x["connection_details"]["name"] == c["name"] and x.get("consumer_count") == 1]
        chans = eventually("the channel is listed", our_channel)
        assert chans[0]["name"] == f"{c['name']} (1)"
        assert chans[0]["prefetch_count"] == 5

        consumers = eventually("the consumer is listed", lambda: [
            k for k in admin_json("list", "consumers") if k["consumer_tag"] == f"tag-{q}"])
        assert consumers[0]["queue"] == {"name": q, "vhost": "/"}
        assert consumers[0]["ack_required"] is True
        assert consumers[0]["prefetch_count"] == 5

        assert admin("close", "connection", f"name={c['name']}")[1].strip() == "connection closed"
        with pytest.raises(pika.exceptions.ConnectionClosed) as e:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.2)
        assert e.value.reply_code == 320
        assert e.value.reply_text == "CONNECTION_FORCED - Closed via management plugin"
        eventually("the connection is gone", lambda: ours() is None)
    finally:
        if conn.is_open:
            conn.close()
        admin("delete", "queue", f"name={q}")


def test_users_vhosts_policies_list_declare_delete():
    users = admin_json("list", "users")
    assert "guest" in [u["name"] for u in users]
    guest = next(u for u in users if u["name"] == "guest")
    assert guest["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert "/" in [v["name"] for v in admin_json("list", "vhosts")]
    p = name("pol")
    assert admin("declare", "policy", f"name={p}", "pattern=^adm-nothing$",
                 'definition={"max-length": 5}', "apply-to=queues")[1].strip() == "policy declared"
    pol = [x for x in admin_json("list", "policies") if x["name"] == p]
    assert pol and pol[0]["definition"] == {"max-length": 5} and pol[0]["apply-to"] == "queues"
    assert admin("delete", "policy", f"name={p}")[1].strip() == "policy deleted"
    assert p not in [x["name"] for x in admin_json("list", "policies")]


def test_export_and_import_definitions():
    q = name("dq")
    admin("declare", "queue", f"name={q}", "durable=true", 'arguments={"x-queue-type":"quorum"}')
    d = tempfile.mkdtemp()
    try:
        path = os.path.join(d, "defs.json")
        out = admin("export", path)[1]
        assert out.startswith("Exported definitions for ")
        defs = json.load(open(path))
        assert q in [x["name"] for x in defs["queues"]]
        admin("delete", "queue", f"name={q}")
        out = admin("import", path)[1]
        assert out.startswith("Uploaded definitions from ")
        eventually("the queue is back", lambda: q in [i["name"] for i in admin_json("list", "queues")])
    finally:
        shutil.rmtree(d)
        admin("delete", "queue", f"name={q}")
