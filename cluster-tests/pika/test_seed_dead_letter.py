"""Seed 003's three Java dead-letter scenarios, with the seed's names, against
quorum source queues: rejected, per-queue message TTL (5000 ms in the seed,
500 ms here) and queue length limit 5. Asserts bodies, every x-death field
(with wire types: count is long 'l', time is a timestamp 'T') and the
x-first-death-* headers."""
import datetime
import time

import pika

from conftest import assert_empty, fresh, get_n, get_one

QUORUM = {"x-queue-type": "quorum"}


def assert_x_death(props, *, queue, reason, exchange, routing_keys, t0, t1, original_expiration=None, count=1):
    headers = props.headers or {}
    deaths = headers.get("x-death")
    assert isinstance(deaths, list) and len(deaths) == 1, f"x-death: {deaths!r}"
    d = deaths[0]
    expected_keys = {"count", "reason", "queue", "time", "exchange", "routing-keys"}
    if original_expiration is not None:
        expected_keys.add("original-expiration")
    assert set(d.keys()) == expected_keys, d
    assert d["queue"] == queue
    assert d["reason"] == reason
    assert d["count"] == count and d["count"].amqp_type == "l", (d["count"], getattr(d["count"], "amqp_type", None))
    assert isinstance(d["time"], datetime.datetime), d["time"]  # AMQP timestamp 'T' (seconds)
    ts = d["time"].replace(tzinfo=datetime.timezone.utc).timestamp() if d["time"].tzinfo is None else d["time"].timestamp()
    assert int(t0) - 1 <= ts <= t1 + 1, (ts, t0, t1)
    assert d["exchange"] == exchange
    assert d["routing-keys"] == routing_keys
    if original_expiration is not None:
        assert d["original-expiration"] == original_expiration
    assert headers["x-first-death-reason"] == reason
    assert headers["x-first-death-queue"] == queue
    assert headers["x-first-death-exchange"] == exchange
    assert props.expiration is None, "expiration is removed from dead letters"


def test_rejected(conn, ch):
    fresh(ch, "normal.queue.test", "dl.queue.test", exchanges=["normal.exchange.test", "dl.exchange.test"])
    ch.exchange_declare("normal.exchange.test", exchange_type="topic")
    ch.exchange_declare("dl.exchange.test", exchange_type="topic")
    ch.queue_declare("dl.queue.test", durable=True, arguments=QUORUM)
    ch.queue_bind("dl.queue.test", "dl.exchange.test", "#.dl.routing.key")
    ch.queue_declare("normal.queue.test", durable=True, arguments={
        **QUORUM,
        "x-dead-letter-exchange": "dl.exchange.test",
        "x-dead-letter-routing-key": "dl.routing.key",
    })
    ch.queue_bind("normal.queue.test", "normal.exchange.test", "*.normal.routing.key")

    t0 = time.time()
    bodies = [f"reject me {i}".encode() for i in range(3)]
    for b in bodies:
        ch.basic_publish("normal.exchange.test", "prefix.normal.routing.key", b,
                         properties=pika.BasicProperties(message_id=b.decode(), headers={"app": "seed"}))

    # NormalConsumer: reject every delivery with requeue=false
    rejected = 0
    for method, props, body in ch.consume("normal.queue.test", auto_ack=False, inactivity_timeout=10):
        assert method is not None, "normal consumer got nothing within 10 s"
        assert body == bodies[rejected]
        ch.basic_reject(method.delivery_tag, requeue=False)
        rejected += 1
        if rejected == len(bodies):
            break
    ch.cancel()

    # DLConsumer (auto-ack)
    got = get_n(ch, "dl.queue.test", len(bodies))
    t1 = time.time()
    assert [b for _, _, b in got] == bodies
    for i, (method, props, body) in enumerate(got):
        assert method.exchange == "dl.exchange.test"
        assert method.routing_key == "dl.routing.key"
        assert props.message_id == bodies[i].decode()
        assert props.headers["app"] == "seed"
        assert_x_death(props, queue="normal.queue.test", reason="rejected", exchange="normal.exchange.test",
                       routing_keys=["prefix.normal.routing.key"], t0=t0, t1=t1)
    assert_empty(ch, "normal.queue.test")
    assert_empty(ch, "dl.queue.test")
    fresh(ch, "normal.queue.test", "dl.queue.test", exchanges=["normal.exchange.test", "dl.exchange.test"])


def test_message_ttl(conn, ch):
    names = ("msg.ttl.queue.test", "msg.ttl.dl.queue.test")
    exchanges = ["msg.ttl.exchange.test", "msg.ttl.dl.exchange.test"]
    fresh(ch, *names, exchanges=exchanges)
    ch.exchange_declare("msg.ttl.dl.exchange.test", exchange_type="topic")
    ch.queue_declare("msg.ttl.dl.queue.test", durable=True, arguments=QUORUM)
    ch.queue_bind("msg.ttl.dl.queue.test", "msg.ttl.dl.exchange.test", "#.msg.ttl.dl.routing.key")
    ch.queue_declare("msg.ttl.queue.test", durable=True, arguments={
        **QUORUM,
        "x-dead-letter-exchange": "msg.ttl.dl.exchange.test",
        "x-dead-letter-routing-key": "msg.ttl.dl.routing.key",
        "x-message-ttl": 500,  # the seed uses 5000 ms
    })
    ch.exchange_declare("msg.ttl.exchange.test", exchange_type="topic")
    ch.queue_bind("msg.ttl.queue.test", "msg.ttl.exchange.test", "#.msg.ttl.routing.key")

    t0 = time.time()
    ch.basic_publish("msg.ttl.exchange.test", "msg.ttl.routing.key", b"expire me")
    # a second message that also carries a per-message expiration (60 s, longer than the queue TTL)
    ch.basic_publish("msg.ttl.exchange.test", "msg.ttl.routing.key", b"expire me too",
                     properties=pika.BasicProperties(expiration="60000"))
    # nothing consumes msg.ttl.queue.test; the messages must not dead-letter before the TTL
    method, _, _ = ch.basic_get("msg.ttl.dl.queue.test", auto_ack=True)
    assert method is None or time.time() - t0 >= 0.5, "dead-lettered before the TTL"

    got = get_n(ch, "msg.ttl.dl.queue.test", 2, timeout=15)
    t1 = time.time()
    assert t1 - t0 >= 0.45, f"dead-lettered after {t1 - t0:.3f}s, TTL is 0.5 s"
    (m1, p1, b1), (m2, p2, b2) = got
    assert (b1, b2) == (b"expire me", b"expire me too")
    for m in (m1, m2):
        assert m.exchange == "msg.ttl.dl.exchange.test"
        assert m.routing_key == "msg.ttl.dl.routing.key"
    assert_x_death(p1, queue="msg.ttl.queue.test", reason="expired", exchange="msg.ttl.exchange.test",
                   routing_keys=["msg.ttl.routing.key"], t0=t0, t1=t1)
    assert_x_death(p2, queue="msg.ttl.queue.test", reason="expired", exchange="msg.ttl.exchange.test",
                   routing_keys=["msg.ttl.routing.key"], t0=t0, t1=t1, original_expiration="60000")
    assert_empty(ch, "msg.ttl.queue.test")
    fresh(ch, *names, exchanges=exchanges)


def test_queue_length_limit(conn, ch):
    names = ("length.limit.queue.test", "length.limit.dl.queue.test")
    exchanges = ["length.limit.exchange.test", "length.limit.dl.exchange.test"]
    fresh(ch, *names, exchanges=exchanges)
    ch.exchange_declare("length.limit.dl.exchange.test", exchange_type="topic")
    ch.queue_declare("length.limit.dl.queue.test", durable=True, arguments=QUORUM)
    ch.queue_bind("length.limit.dl.queue.test", "length.limit.dl.exchange.test", "#.length.limit.dl.routing.key")
    ch.queue_declare("length.limit.queue.test", durable=True, arguments={
        **QUORUM,
        "x-dead-letter-exchange": "length.limit.dl.exchange.test",
        "x-dead-letter-routing-key": "length.limit.dl.routing.key",
        "x-max-length": 5,
    })
    ch.exchange_declare("length.limit.exchange.test", exchange_type="topic")
    ch.queue_bind("length.limit.queue.test", "length.limit.exchange.test", "#.length.limit.routing.key")

    t0 = time.time()
    bodies = [f"msg-{i}".encode() for i in range(8)]
    for b in bodies:
        ch.basic_publish("length.limit.exchange.test", "length.limit.routing.key", b)

    # default overflow drop-head: the 3 oldest are dead-lettered with reason maxlen
    got = get_n(ch, "length.limit.dl.queue.test", 3)
    t1 = time.time()
    assert [b for _, _, b in got] == bodies[:3]
    for m, p, _ in got:
        assert m.exchange == "length.limit.dl.exchange.test"
        assert m.routing_key == "length.limit.dl.routing.key"
        assert_x_death(p, queue="length.limit.queue.test", reason="maxlen", exchange="length.limit.exchange.test",
                       routing_keys=["length.limit.routing.key"], t0=t0, t1=t1)
    assert_empty(ch, "length.limit.dl.queue.test")
    # the 5 newest stay in the source queue, in order
    assert ch.queue_declare("length.limit.queue.test", passive=True).method.message_count == 5
    kept = get_n(ch, "length.limit.queue.test", 5)
    assert [b for _, _, b in kept] == bodies[3:]
    assert all(not (p.headers or {}).get("x-death") for _, p, _ in kept)
    fresh(ch, *names, exchanges=exchanges)
