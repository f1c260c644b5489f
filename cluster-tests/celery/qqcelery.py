"""The Celery 5.5 app the Celery end-to-end tests run (issue 28 item 7).

Quorum queues (`task_default_queue_type = "quorum"`), publisher confirms, and
therefore Celery's native delayed delivery for countdown/ETA tasks (kombu
`native_delayed_delivery`: 28 levels of `celery_delayed_N` quorum queues with
`x-message-ttl`, at-least-once dead-lettering and reject-publish).

Every task appends one line to `$QQ_CELERY_RECORD/<kind>.log`:
`<key> <unix time, s> [extra]` (one O_APPEND write per line: whole lines even
with several worker threads or processes).
"""
import os
import time

from celery import Celery

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
RECORD = os.environ.get("QQ_CELERY_RECORD", "/tmp/qq-celery-record")

app = Celery("qqcelery", broker=AMQP_URL.replace("amqp://", "pyamqp://", 1))
app.conf.update(
    task_default_queue_type="quorum",
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_ignore_result=True,
)


def record(kind, key, extra=""):
    """Appends `<key> <now> <extra>` to the `kind` log."""
    os.makedirs(RECORD, exist_ok=True)
    line = f"{key} {time.time():.3f} {extra}".rstrip() + "\n"
    fd = os.open(os.path.join(RECORD, f"{kind}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task
def work(key):
    """A plain task: records that it ran."""
    record("work", key)


@app.task
def delayed(key):
    """A countdown task: records when it ran."""
    record("delayed", key)


@app.task(bind=True, max_retries=5)
def retry_twice(self, key):
    """Fails twice, retrying with countdown=3 (two delay levels each time:
    `celery_delayed_1` then `celery_delayed_0`), then completes."""
    record("attempt", key, str(self.request.retries))
    if self.request.retries < 2:
        raise self.retry(countdown=3)
    record("done", key)


@app.task(bind=True, acks_late=True)
def slow(self, key):
    """An acks_late task that takes 60 s on its first delivery (the test kills
    the worker meanwhile) and completes at once when redelivered."""
    redelivered = bool(self.request.delivery_info.get("redelivered"))
    record("slow_start", key, "redelivered" if redelivered else "first")
    if not redelivered:
        time.sleep(60)
    record("slow_done", key, "redelivered" if redelivered else "first")
