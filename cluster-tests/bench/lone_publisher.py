#!/usr/bin/env python3
"""A lone publisher waiting for each confirm (pika BlockingConnection), the
latency issue's last row: 1 KiB persistent messages to a fresh quorum queue,
one at a time, each confirmed before the next is sent. Prints msg/s.

    cluster-tests/bench/lone_publisher.py PORT [MESSAGES]
"""
import sys
import time

import pika

port = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
conn = pika.BlockingConnection(pika.ConnectionParameters(port=port))
ch = conn.channel()
queue = f"lone-publisher-{int(time.time() * 1000)}"
ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
ch.confirm_delivery()
body = b"x" * 1024
props = pika.BasicProperties(delivery_mode=2)
for _ in range(200):  # warm-up
    ch.basic_publish("", queue, body, props)
start = time.perf_counter()
for _ in range(n):
    ch.basic_publish("", queue, body, props)
elapsed = time.perf_counter() - start
ch.queue_delete(queue)
conn.close()
print(f"lone publisher: {n} confirmed one at a time in {elapsed:.2f} s = {n / elapsed:.0f} msg/s")
