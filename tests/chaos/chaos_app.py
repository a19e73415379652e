"""The app the chaos tests run in real `joblane worker` processes.

Every run of a task appends "job_id attempt pid kind" to the file named by
CHAOS_RUNS, with one write(2) on an O_APPEND descriptor: the line survives a
SIGKILL a microsecond later and a PostgreSQL restart, which a row in the
database would not. The invariants compare these runs with the attempts
table. Each kind ends its job in one known way (see EXPECTED).
"""

from __future__ import annotations

import asyncio
import os
import time

import joblane

app = joblane.App(lease_seconds=float(os.environ.get("CHAOS_LEASE", "2")))
_log: int | None = None

# kind -> the state its job must end in
EXPECTED = {
    "ok": "done",
    "slow": "done",
    "flaky": "done",  # raises on its first two tries
    "bad": "failed",  # PermanentError
    "review": "held",  # Hold
    "hang": "failed",  # sleeps past its timeout on both of its two tries
    "exit": "done",  # kills its own worker process on the first try
    "plain": "done",  # a plain def in a thread, Python between short sleeps: a stop lands at once
    "plain_hang": "failed",  # a plain def busy past its timeout on both of its two tries
    "child": "done",  # executor="process": a child blocked in C, ended by SIGTERM/SIGKILL when told
}
# kinds whose every try also writes a start and an end line with times (spans): two tries of one job
# must never overlap, which the attempts rows alone cannot show
SPANNED = {"plain", "plain_hang", "child"}


def ran(job: joblane.Job) -> None:
    global _log
    if _log is None:
        _log = os.open(os.environ["CHAOS_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_log, f"{job.id} {job.attempt} {os.getpid()} {job.kind}\n".encode())


def span(what: str, job: joblane.Job) -> None:
    """One line of CHAOS_RUNS.spans: "start|end job_id pid time" (a fresh descriptor: a child has its own)."""
    fd = os.open(os.environ["CHAOS_RUNS"] + ".spans", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {job.id} {os.getpid()} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


@app.task("ok", max_attempts=25, backoff=0.05)
async def ok(job: joblane.Job) -> dict:
    ran(job)
    return {"n": job.payload.get("n")}


@app.task("slow", max_attempts=25, backoff=0.05)
async def slow(job: joblane.Job) -> None:
    ran(job)
    await asyncio.sleep(float(job.payload.get("seconds", 0.5)))


@app.task("flaky", max_attempts=25, backoff=0.05)
async def flaky(job: joblane.Job) -> str:
    ran(job)
    if job.attempt < 3:
        raise ConnectionError(f"upstream refused try {job.attempt}")
    return "third time lucky"


@app.task("bad", max_attempts=25)
def bad(job: joblane.Job) -> None:  # a plain function: runs in a thread
    ran(job)
    raise joblane.PermanentError("this lead has no email address")


@app.task("review", max_attempts=25)
async def review(job: joblane.Job) -> None:
    ran(job)
    raise joblane.Hold("confidence 0.41 is below 0.6", {"label": "maybe"})


@app.task("hang", max_attempts=2, backoff=0.05, timeout=0.3)
async def hang(job: joblane.Job) -> None:
    ran(job)
    await asyncio.sleep(60)


@app.task("exit", max_attempts=25, backoff=0.05)
async def exit_process(job: joblane.Job) -> None:
    ran(job)
    if job.attempt == 1:
        os._exit(17)  # no cleanup, no goodbye: like a segfault in a native library


@app.task("plain", max_attempts=25, backoff=0.05)
def plain(job: joblane.Job) -> None:
    ran(job)
    span("start", job)
    try:
        deadline = time.monotonic() + float(job.payload.get("seconds", 0.2))
        while time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        span("end", job)


@app.task("plain_hang", max_attempts=2, backoff=0.05, timeout=0.3)
def plain_hang(job: joblane.Job) -> None:
    ran(job)
    span("start", job)
    try:
        n = 0
        while True:
            n += 1
    finally:
        span("end", job)


@app.task("child", max_attempts=25, backoff=0.05, executor="process")
def child(job: joblane.Job) -> None:
    ran(job)
    span("start", job)
    try:
        time.sleep(float(job.payload.get("seconds", 0.2)))
    finally:
        span("end", job)
