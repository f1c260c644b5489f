#!/usr/bin/env python3
"""Confirm gap across a leader failure (cluster issue, benchmark).

One publisher on a node that does not lead the queue publishes persistent
messages one at a time, each waiting for its publisher confirm. After
WARMUP seconds the script runs the fault command (e.g. kill -9 of the
leader's node, or SIGSTOP) and keeps publishing; the result is the longest
time between two consecutive confirms from the fault on (the confirm gap),
and the number of confirms lost (a message confirmed must be consumable
afterwards). Prints one line: `failover: gap_s=... confirmed=... lost=...`.

usage: failover.py PUBLISH_PORT CONSUME_PORT QUEUE 'fault shell command' ['heal shell command']
The queue must exist, led by the node the fault hits.
"""
import subprocess
import sys
import time

import pika

pub_port, consume_port, queue, fault = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
heal = sys.argv[5] if len(sys.argv) > 5 else None
WARMUP, AFTER = 2.0, 12.0

params = lambda port: pika.ConnectionParameters(
    port=port, heartbeat=0, blocked_connection_timeout=30, socket_timeout=30)
conn = pika.BlockingConnection(params(pub_port))
ch = conn.channel()
ch.confirm_delivery()
props = pika.BasicProperties(delivery_mode=2)
confirmed, fault_at, gaps, last = set(), None, [], None
n, start = 0, time.monotonic()
while True:
    now = time.monotonic()
    if fault_at is None and now - start > WARMUP:
        subprocess.run(fault, shell=True, check=True)
        fault_at = last = time.monotonic()
    if fault_at is not None and now - fault_at > AFTER:
        break
    n += 1
    body = str(n).encode()
    try:
        ch.basic_publish("", queue, body, props, mandatory=False)
    except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
        continue
    except pika.exceptions.AMQPError:
        # The connection itself broke: reconnect and go on (counts in the gap).
        time.sleep(0.05)
        conn = pika.BlockingConnection(params(pub_port))
        ch = conn.channel()
        ch.confirm_delivery()
        continue
    t = time.monotonic()
    confirmed.add(body)
    if fault_at is not None:
        gaps.append(t - last)
        last = t
if heal:
    subprocess.run(heal, shell=True, check=True)
conn.close()
# Everything confirmed must be there.
c = pika.BlockingConnection(params(consume_port))
ch = c.channel()
got = set()
for method, _props, body in ch.consume(queue, inactivity_timeout=5):
    if method is None:
        break
    got.add(body)
    ch.basic_ack(method.delivery_tag)
c.close()
print(f"failover: gap_s={max(gaps):.3f} confirmed={len(confirmed)} lost={len(confirmed - got)}")
