"""Celery 5.5 end to end on quorumq's quorum queues (issue 28 item 7): plain
tasks run once each; countdown tasks through native delayed delivery run no
earlier than their countdown and within 5 s after it; a task retrying itself
twice with countdown=3 (two delay levels, the retry republished with the
x-death of its first pass) completes; an acks_late task whose worker is
SIGKILLed is redelivered and completes."""
import collections
import time
import uuid

from conftest import Worker, lines, wait_for
import qqcelery


def test_500_tasks_run_once_each(worker, record):
    keys = [f"work-{uuid.uuid4().hex}" for _ in range(500)]
    for k in keys:
        qqcelery.work.delay(k)
    wait_for(lambda: len(lines(record, "work")) >= 500, 120, "500 tasks ran")
    time.sleep(1)  # a duplicate would arrive meanwhile
    ran = collections.Counter(k for k, _, _ in lines(record, "work"))
    assert set(ran) == set(keys), "every task ran"
    assert [k for k, n in ran.items() if n > 1] == [], "no task ran twice"


def test_countdown_tasks_run_on_time(worker, record):
    # The worker declared kombu's native delayed delivery topology on quorum queues.
    with qqcelery.app.connection_for_write() as conn:
        for level in (0, 27):
            _, _, consumers = conn.default_channel.queue_declare(
                f"celery_delayed_{level}", passive=True)
            assert consumers == 0
    countdowns = [1, 2, 3, 5, 8]
    sent = {}
    for c in countdowns:
        key = f"delayed-{c}-{uuid.uuid4().hex}"
        sent[key] = (time.time(), c)
        qqcelery.delayed.apply_async((key,), countdown=c)
    wait_for(lambda: len(lines(record, "delayed")) >= len(countdowns), 60,
             "countdown tasks ran")
    for key, at, _ in lines(record, "delayed"):
        t0, c = sent[key]
        late = at - (t0 + c)
        assert late >= -0.05, f"{key} ran {-late:.3f}s before its countdown"
        assert late <= 5, f"{key} ran {late:.3f}s after its countdown"


def test_a_task_retrying_twice_with_countdown_3_completes(worker, record):
    key = f"retry-{uuid.uuid4().hex}"
    t0 = time.time()
    qqcelery.retry_twice.delay(key)
    wait_for(lambda: any(k == key for k, _, _ in lines(record, "done")), 60,
             "the twice-retried task completed")
    attempts = [(at, n) for k, at, n in lines(record, "attempt") if k == key]
    assert [n for _, n in attempts] == ["0", "1", "2"]
    for (a, _), (b, _) in zip(attempts, attempts[1:]):
        assert b - a >= 3 - 0.05, f"retry ran {b - a:.3f}s after the failure"
        assert b - a <= 3 + 5, f"retry ran {b - a:.3f}s after the failure"
    assert attempts[0][0] - t0 < 10


def test_acks_late_task_is_redelivered_after_worker_sigkill(record):
    queue = f"qq_slow_{uuid.uuid4().hex[:8]}"
    first = Worker(record, [queue], pool="solo", concurrency=1, name="slow1")
    try:
        first.wait_ready()
        key = f"slow-{uuid.uuid4().hex}"
        qqcelery.slow.apply_async((key,), queue=queue)
        wait_for(lambda: any(k == key for k, _, _ in lines(record, "slow_start")),
                 30, "the slow task started")
        first.kill9()
    finally:
        first.stop()
    second = Worker(record, [queue], pool="solo", concurrency=1, name="slow2")
    try:
        second.wait_ready()
        wait_for(lambda: any(k == key for k, _, _ in lines(record, "slow_done")),
                 60, "the killed worker's task was redelivered and completed")
        done = [e for k, _, e in lines(record, "slow_done") if k == key]
        assert done == ["redelivered"], done
    finally:
        second.stop()
