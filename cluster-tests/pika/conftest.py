"""Shared fixtures for the pika compatibility tests.

AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f) selects the broker.
Every wait is bounded; helpers poll with a deadline instead of sleeping blindly.
"""
import os
import time

import pika
import pytest

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")


@pytest.fixture
def conn():
    params = pika.URLParameters(AMQP_URL)
    params.socket_timeout = 10
    params.blocked_connection_timeout = 30
    c = pika.BlockingConnection(params)
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def ch(conn):
    channel = conn.channel()
    channel.confirm_delivery()
    return channel


def get_one(ch, queue, timeout=10.0, auto_ack=True):
    """basic.get until a message arrives or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, props, body
        ch.connection.sleep(0.02)
    raise AssertionError(f"no message on {queue} within {timeout}s")


def get_n(ch, queue, n, timeout=10.0):
    return [get_one(ch, queue, timeout) for _ in range(n)]


def assert_empty(ch, queue):
    method, _, body = ch.basic_get(queue, auto_ack=True)
    assert method is None, f"unexpected message on {queue}: {body!r}"


def fresh(ch, *queues, exchanges=()):
    """Delete the seed-named queues/exchanges left by an earlier run."""
    for q in queues:
        ch.queue_delete(q)
    for e in exchanges:
        ch.exchange_delete(e)


class AmqpInt(int):
    """An int decoded from a field table, remembering its AMQP type letter."""
    amqp_type = "?"


_orig_decode_value = pika.data.decode_value


def _typed_decode_value(encoded, offset):
    kind = encoded[offset:offset + 1].decode("latin-1")
    value, new_offset = _orig_decode_value(encoded, offset)
    if isinstance(value, int) and not isinstance(value, bool):
        value = AmqpInt(value)
        value.amqp_type = kind
    return value, new_offset


# decode_table and array decoding look decode_value up in the module, so this
# tags every integer in every received header table with its wire type.
pika.data.decode_value = _typed_decode_value
