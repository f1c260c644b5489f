"""Fixtures for the Celery end-to-end tests: a record directory and Celery
workers run as real processes (`python3 -m celery -A qqcelery worker`)
against AMQP_URL (cluster-tests/compat/with-quorumq.sh sets it)."""
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


class Worker:
    """One `celery worker` process consuming `queues`."""

    def __init__(self, record, queues, pool="threads", concurrency=4, name="w1"):
        env = dict(os.environ, QQ_CELERY_RECORD=record)
        self.log_path = os.path.join(record, f"worker-{name}.log")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "qqcelery", "worker",
             "-P", pool, "-c", str(concurrency), "-Q", ",".join(queues),
             "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "--loglevel=INFO"],
            cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait_ready(self, timeout=60):
        """Waits for the worker's "ready." log line (its queues, and the
        native delayed delivery topology, are declared by then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                if b" ready." in f.read():
                    return
            assert self.proc.poll() is None, f"worker exited: {self.tail()}"
            time.sleep(0.1)
        raise AssertionError(f"worker not ready within {timeout}s: {self.tail()}")

    def tail(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def kill9(self):
        """SIGKILL the worker's whole process group (pool children too)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.log.close()


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    return str(tmp_path_factory.mktemp("celery-record"))


@pytest.fixture(scope="module")
def worker(record):
    """A worker (4 threads) on the default `celery` queue."""
    w = Worker(record, ["celery"])
    w.wait_ready()
    yield w
    w.stop()


def lines(record, kind):
    """The `kind` log's lines as (key, time, extra) tuples."""
    path = os.path.join(record, f"{kind}.log")
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            out.append((parts[0], float(parts[1]), " ".join(parts[2:])))
    return out


def wait_for(pred, timeout, what):
    """Polls `pred()` until true, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout}s")
