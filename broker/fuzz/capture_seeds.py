#!/usr/bin/env python3
"""Seeds for the `connection` fuzz target from real pika sessions.

    python3 broker/fuzz/capture_seeds.py [BROKER_HOST:PORT]   # default 127.0.0.1:5672

Runs a few typical client sessions (publish with confirms, consume and settle,
dead-lettering, transactions, exchange and queue management) through a local
recording proxy to a running broker (RabbitMQ or quorumq), and writes each
session's client-to-server frames, minus the handshake and the final
connection.close that the target adds itself, in the target's input format
(`[kind][channel][len lo][len hi][payload]`, see fuzz_targets/connection.rs) to
broker/fuzz/seeds/connection/<session>, and the raw bytes (protocol header
included) to broker/fuzz/seeds/frame_reader/pika_<session>.
"""
import os
import socket
import struct
import sys
import threading

import pika

KINDS = {1: 0, 2: 1, 3: 2, 8: 3}
HANDSHAKE = {(10, 11), (10, 31), (10, 40), (10, 50), (10, 51)}


class Recorder:
    """A one-connection TCP proxy that keeps what the client sent."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.sent = bytearray()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        client, _ = self.listener.accept()
        server = socket.create_connection(self.upstream)

        def pump(src, dst, keep):
            while True:
                try:
                    b = src.recv(65536)
                except OSError:
                    b = b""
                if not b:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                if keep:
                    self.sent.extend(b)
                dst.sendall(b)

        t = threading.Thread(target=pump, args=(client, server, True), daemon=True)
        t.start()
        pump(server, client, False)
        t.join(5)


def encode(captured):
    """Client bytes -> fuzz input: frames after the protocol header, handshake dropped."""
    out = bytearray()
    b = bytes(captured[8:])
    while len(b) >= 8:
        kind, channel, size = struct.unpack(">BHI", b[:7])
        payload = b[7:7 + size]
        b = b[8 + size:]
        if kind == 1 and len(payload) >= 4 and struct.unpack(">HH", payload[:4]) in HANDSHAKE:
            continue
        if kind not in KINDS or size > 1023:
            continue
        out += bytes([KINDS[kind], channel % 4]) + struct.pack("<H", size) + payload
    return bytes(out)


def get_one(ch, q):
    """basic.get until a message comes (a quorum queue enqueues asynchronously)."""
    for _ in range(100):
        m, _, _ = ch.basic_get(q)
        if m is not None:
            return m
        ch.connection.sleep(0.05)
    raise RuntimeError(f"nothing to get from {q}")


def publish_confirm(ch):
    ch.queue_declare("seed.q", durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", "seed.q", b"m%d" % i,
                         pika.BasicProperties(delivery_mode=2, headers={"k": i}, expiration="60000"))
    ch.basic_ack(get_one(ch, "seed.q").delivery_tag)
    m = get_one(ch, "seed.q")
    ch.basic_nack(m.delivery_tag, requeue=True)


def consume(ch):
    ch.queue_declare("seed.c", durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_qos(prefetch_count=2)
    for i in range(3):
        ch.basic_publish("", "seed.c", b"c%d" % i)
    got = []
    tag = ch.basic_consume("seed.c", lambda c, m, p, b: got.append(m.delivery_tag), consumer_tag="ct")
    while len(got) < 2:
        ch.connection.process_data_events(time_limit=1)
    ch.basic_ack(got[0])
    ch.basic_reject(got[1], requeue=False)
    ch.basic_cancel(tag)
    ch.queue_purge("seed.c")


def dead_letter(ch):
    ch.exchange_declare("seed.dlx", "fanout", durable=True)
    ch.queue_declare("seed.dlq", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind("seed.dlq", "seed.dlx")
    ch.queue_declare("seed.src", durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": "seed.dlx",
        "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        "x-delivery-limit": 2, "x-message-ttl": 60000})
    ch.basic_publish("", "seed.src", b"d", pika.BasicProperties(headers={
        "x-death": [{"count": 1, "reason": "rejected", "queue": "q", "exchange": "",
                     "routing-keys": ["q"]}]}))
    ch.basic_reject(get_one(ch, "seed.src").delivery_tag, requeue=False)


def transactions(ch):
    ch.queue_declare("seed.tx", durable=True, arguments={"x-queue-type": "quorum"})
    ch.tx_select()
    ch.basic_publish("", "seed.tx", b"t1")
    ch.tx_commit()
    ch.basic_publish("", "seed.tx", b"t2")
    ch.tx_rollback()


def management(ch):
    ch.exchange_declare("seed.topic", "topic", durable=True)
    ch.exchange_declare("seed.headers", "headers", auto_delete=True)
    ch.exchange_bind("seed.headers", "seed.topic", "a.#")
    r = ch.queue_declare("", exclusive=True)
    ch.queue_bind(r.method.queue, "seed.topic", "a.*.c")
    ch.queue_bind(r.method.queue, "seed.headers", arguments={"x-match": "any", "h": 1})
    ch.basic_publish("seed.topic", "a.b.c", b"x", mandatory=True)
    ch.queue_unbind(r.method.queue, "seed.topic", "a.*.c")
    ch.exchange_unbind("seed.headers", "seed.topic", "a.#")
    ch.exchange_delete("seed.headers")
    ch.queue_declare("seed.classic", durable=True, arguments={"x-queue-type": "classic"})
    ch.queue_delete("seed.classic", if_empty=True)
    ch.flow(True)


def main():
    host, _, port = (sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:5672").partition(":")
    upstream = (host, int(port or 5672))
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "connection")
    raw_dir = os.path.join(os.path.dirname(out_dir), "frame_reader")
    os.makedirs(out_dir, exist_ok=True)
    for session in (publish_confirm, consume, dead_letter, transactions, management):
        rec = Recorder(upstream)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rec.port))
        ch = conn.channel()
        try:
            session(ch)
        except (pika.exceptions.AMQPError, RuntimeError) as e:
            print(f"{session.__name__}: {e!r} (kept what was sent)")
        if conn.is_open:
            conn.close()
        data = encode(rec.sent)
        with open(os.path.join(out_dir, session.__name__), "wb") as f:
            f.write(data)
        # The raw socket bytes seed the frame reader too (first byte: its chunk size).
        with open(os.path.join(raw_dir, "pika_" + session.__name__), "wb") as f:
            f.write(bytes([97]) + bytes(rec.sent))
        print(f"{session.__name__}: {len(data)} bytes")
    # Clean up what the sessions left on the broker.
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, upstream[1]))
    ch = conn.channel()
    for q in ("seed.q", "seed.c", "seed.dlq", "seed.src", "seed.tx"):
        ch.queue_delete(q)
    for x in ("seed.dlx", "seed.topic"):
        ch.exchange_delete(x)
    conn.close()


if __name__ == "__main__":
    main()
