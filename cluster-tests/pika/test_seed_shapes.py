"""The topology shape of seed 003: topic exchange normal.exchange.test bound
with *.normal.routing.key to a durable quorum queue; publish
prefix.normal.routing.key, consume, ack."""
import pika

from conftest import assert_empty, fresh

QUORUM = {"x-queue-type": "quorum"}


def test_topic_publish_consume_ack(conn, ch):
    fresh(ch, "normal.queue.test", exchanges=["normal.exchange.test"])
    ch.exchange_declare("normal.exchange.test", exchange_type="topic")
    q = ch.queue_declare("normal.queue.test", durable=True, arguments=QUORUM)
    assert q.method.queue == "normal.queue.test"
    assert q.method.message_count == 0
    ch.queue_bind("normal.queue.test", "normal.exchange.test", "*.normal.routing.key")

    # confirm_delivery() is on: publish raises on nack / unroutable mandatory
    ch.basic_publish("normal.exchange.test", "prefix.normal.routing.key", b"hello seed",
                     properties=pika.BasicProperties(delivery_mode=2, content_type="text/plain"),
                     mandatory=True)
    # does not match *.normal.routing.key (two words before it)
    try:
        ch.basic_publish("normal.exchange.test", "a.b.normal.routing.key", b"unroutable", mandatory=True)
        raise AssertionError("expected the mandatory publish to be returned")
    except pika.exceptions.UnroutableError as e:
        assert e.messages[0].body == b"unroutable"

    got = []
    for method, props, body in ch.consume("normal.queue.test", auto_ack=False, inactivity_timeout=10):
        assert method is not None, "no delivery within 10 s"
        got.append((method, props, body))
        ch.basic_ack(method.delivery_tag)
        break
    ch.cancel()
    method, props, body = got[0]
    assert body == b"hello seed"
    assert method.exchange == "normal.exchange.test"
    assert method.routing_key == "prefix.normal.routing.key"
    assert method.redelivered is False
    assert props.content_type == "text/plain"
    assert props.delivery_mode == 2
    assert_empty(ch, "normal.queue.test")
    passive = ch.queue_declare("normal.queue.test", passive=True)
    assert passive.method.message_count == 0
    ch.queue_delete("normal.queue.test")
    ch.exchange_delete("normal.exchange.test")


def test_quorum_queue_redeclare_without_type(conn):
    """RabbitMQ 3.10.8 (default type classic) refuses the redeclare with 406.
    quorumq makes durable queues quorum queues by default (README, deliberate
    difference), so there the same redeclare is equivalent."""
    ch = conn.channel()
    fresh(ch, "normal.queue.shape.test")
    ch.queue_declare("normal.queue.shape.test", durable=True, arguments=QUORUM)
    product = conn._impl.server_properties.get("product", b"")
    if isinstance(product, bytes):
        product = product.decode()
    if product == "quorumq":
        ok = ch.queue_declare("normal.queue.shape.test", durable=True, arguments={})
        assert ok.method.queue == "normal.queue.shape.test"
    else:
        try:
            ch.queue_declare("normal.queue.shape.test", durable=True, arguments={})
            raise AssertionError("expected 406")
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 406
            assert e.reply_text == ("PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue "
                                    "'normal.queue.shape.test' in vhost '/': received none but current is "
                                    "the value 'quorum' of type 'longstr'")
    conn.channel().queue_delete("normal.queue.shape.test")
