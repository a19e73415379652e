"""Tasks that are told to stop: plain ones in threads and ones in child processes.

Every try appends "start" and "end" lines to the file named by TEST_RECORD
(O_APPEND: one write per line, whole), with the job, the attempt, the pid
that ran it and the time: the outside record the stop tests read. A try's
first start runs long (``seconds`` of the payload); a later start of the
same job runs ``then`` seconds, so the job can finish once it was given back.
"""

from __future__ import annotations

import os
import time

import joblane

app = joblane.App(lease_seconds=float(os.environ.get("TEST_LEASE", "30")))
RECORD = os.environ.get("TEST_RECORD", os.devnull)


def note(what: str, job: joblane.Job) -> None:
    line = f"{what} {job.id} {job.attempt} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def starts(job_id: int) -> int:
    try:
        with open(RECORD) as f:
            return sum(1 for line in f if line.split()[:2] == ["start", str(job_id)])
    except FileNotFoundError:
        return 0


def seconds(job: joblane.Job) -> float:
    first = starts(job.id) <= 1
    return float(job.payload.get("seconds", 15) if first else job.payload.get("then", 0.2))


@app.task("steps", queue="stop")
def steps(job: joblane.Job) -> str:
    """Python code between short sleeps: an interruption lands within a tenth of a second."""
    note("start", job)
    try:
        deadline = time.monotonic() + seconds(job)
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return "finished"
    finally:
        note("end", job)


@app.task("blocked", queue="stop")
def blocked(job: joblane.Job) -> str:
    """One call into C that no interruption reaches before it returns."""
    note("start", job)
    try:
        time.sleep(seconds(job))
        return "finished"
    finally:
        note("end", job)


@app.task("busy", queue="stop", timeout=float(os.environ.get("TEST_TIMEOUT", "1")))
def busy(job: joblane.Job) -> int:
    """A pure-Python busy loop, stopped by its timeout."""
    note("start", job)
    try:
        deadline = time.monotonic() + seconds(job)
        n = 0
        while time.monotonic() < deadline:
            n += 1
        return n
    finally:
        note("end", job)


@app.task("child", queue="stop", executor="process", timeout=float(os.environ.get("TEST_CHILD_TIMEOUT", "60")))
def child(job: joblane.Job) -> dict:
    """In a child process, blocked in C: stopped by SIGTERM, else SIGKILL."""
    note("start", job)
    try:
        job.record(model="m-1")
        time.sleep(seconds(job))
        if job.payload.get("fail"):
            raise ValueError("asked to fail")
        if job.payload.get("die"):
            os._exit(7)
        return {"pid": os.getpid()}
    finally:
        note("end", job)
