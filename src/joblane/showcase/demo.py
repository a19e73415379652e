"""`joblane demo`: the lead-intake example (joblane.showcase.lead_intake) end to end, with crashes on purpose.

What one run does:

1. a database: ``DATABASE_URL``, else an embedded PostgreSQL; the demo's
   schema (``lead_intake`` unless ``--schema``) is dropped and made again,
   migrated, and given the example's ``leads`` table;
2. on loopback ports, in this process: the model server (unless
   ``OPENAI_BASE_URL`` names a real provider), the CRM and the web form;
3. ``joblane worker`` processes and a ``joblane relay`` process;
4. the bundled sample leads, POSTed through the form as a browser would;
5. mid-run, SIGKILL of one worker (while it runs jobs) and of the relay
   (while the CRM holds a request whose contact it already created), each
   restarted at once;
6. once everything settles, a reviewer's turn through the CLI: one held lead
   released with a decision, one rejected;
7. the AI tour: leads scored under a spend cap per tenant (reached, then
   raised with ``joblane budgets set``), one lead twice (its model call is
   cached: the second job makes none), and the scores a first prompt failed
   replayed with a second prompt and compared (``joblane compare``);
8. the summary: every lead is in the CRM (once), not qualified, held,
   rejected or failed with a reason; exit 0 only when that holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .. import store
from ..queries import Queries, parse
from . import DEFAULT_SCHEMA, free_port

APP_SPEC = "joblane.showcase.lead_intake.app:app"
EXAMPLE = Path(__file__).with_name("lead_intake")
SCHEMA_NOTE = "joblane demo: dropped and made again by every `joblane demo` run"
JOB_KINDS = ("enrich", "classify", "deliver")
SHOWN_STATES = ("pending", "running", "done", "held", "failed", "cancelled")
WORKER_LEASE = 5.0  # short leases: a killed worker's jobs come back within seconds
RELAY_LEASE = 3.0
LOCAL_MODEL = "lead-classifier-small"


console = Console()


class DemoError(Exception):
    """The demo cannot go on; the message (one line) says why and where to look."""


@dataclass
class Options:
    leads: int | None = None
    workers: int = 2
    concurrency: int = 12
    rate: float = 25.0
    chaos: bool = True
    review: bool = True
    nightly: bool = True
    serve: bool = False
    port: int = 0
    timeout: float = 150.0
    as_json: bool = False
    ai_tour: bool = True


# -- processes -------------------------------------------------------------------


def _die_with_parent() -> None:
    """In a child before exec: get SIGTERM if the demo dies, so no worker outlives it (Linux only)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_LIBC: Any = None
if sys.platform.startswith("linux"):
    try:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover
        _LIBC = None


class Child:
    """One `joblane ...` subprocess, logging to a file in the run directory."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], cwd: Path, log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name.replace(' ', '-')}.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "joblane", *args], env=env, cwd=cwd,
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent if _LIBC is not None else None)
        self.pid = self.proc.pid
        self.expected_exit = False

    def last_line(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        line = lines[-1] if lines else ""
        with contextlib.suppress(ValueError, TypeError, KeyError):
            line = json.loads(line)["message"]
        return line[:300]

    async def kill(self) -> None:
        self.expected_exit = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        while self.proc.poll() is None:
            await asyncio.sleep(0.02)
        self._log.close()

    async def stop(self, grace: float = 8.0) -> None:
        self.expected_exit = True
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()


def _listen(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise DemoError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} (pick another --port)") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


# -- preparing the database and the example ----------------------------------------


@functools.lru_cache(maxsize=None)
def queries_for(schema: str) -> Queries:
    """The demo's own named queries (demo.sql, not joblane's catalogue) for ``schema``."""
    return Queries(schema, parse(Path(__file__).with_name("demo.sql").read_text(encoding="utf-8")))


def _reset_schema(dsn: str, schema: str) -> None:
    """Drop the demo's schema if an earlier run made it, then make, migrate and mark it."""
    import psycopg
    from psycopg import sql

    from ..app import App
    from ..rules import first_line
    from .lead_intake import db

    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        raise DemoError(f"cannot connect to the database: {first_line(exc)}") from None
    with conn:
        found = store.fetch(conn, store.Statement("demo_schema_note", queries_for(schema).demo_schema_note, (schema,)))
        if found:
            if found[0][0] != SCHEMA_NOTE:
                raise DemoError(f"schema {schema!r} exists and the demo did not make it: "
                                "pick another with --schema NAME (the demo drops its schema on every run)")
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("COMMENT ON SCHEMA {} IS {}").format(sql.Identifier(schema), sql.Literal(SCHEMA_NOTE)))
        App(dsn, schema=schema).migrate(conn)
        db.create_table(conn, schema)


def _load_leads(count: int | None) -> list[dict[str, str]]:
    with open(EXAMPLE / "data" / "leads.json", encoding="utf-8") as f:
        leads = json.load(f)
    if count is not None and count > len(leads):
        raise DemoError(f"--leads is at most {len(leads)}, the size of the bundled sample")
    return leads[:count] if count else leads


# -- the run ---------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What the progress display shows; refreshed from the database twice a second."""

    jobs: dict[str, Counter] = field(default_factory=dict)  # kind -> state -> count
    outbox: Counter = field(default_factory=Counter)
    outbox_retried: int = 0
    model: Counter = field(default_factory=Counter)

    @property
    def unfinished(self) -> int:
        return sum(c["pending"] + c["running"] for c in self.jobs.values())


class Demo:
    def __init__(self, options: Options, *, dsn: str, schema: str, database: str, cwd: Path, run_dir: Path,
                 leads: list[dict[str, str]], env: dict[str, str], sockets: dict[str, socket.socket],
                 urls: dict[str, str], local_model: Any, crm: Any, app: Any, form: Any):
        self.o = options
        self.dsn, self.schema, self.database = dsn, schema, database
        self.cwd, self.run_dir, self.leads, self.env = cwd, run_dir, leads, env
        self.sockets, self.urls = sockets, urls
        self.local_model, self.crm, self.app, self.form = local_model, crm, app, form
        self.started = time.monotonic()
        self.snapshot = Snapshot()
        self.events: list[tuple[float, str]] = []
        self.children: list[Child] = []
        self.workers: list[Child] = []
        self.relay: Child | None = None
        self.accepted: list[int] = []  # lead ids the form answered with 303
        self.refused: list[str] = []
        self.submitting = True
        self.submit_seconds = 0.0
        self.worker_crash: dict[str, Any] = {"done": False}
        self.relay_crash: dict[str, Any] = {"done": False}
        self.review: dict[str, Any] = {"released": None, "released_lead": None, "rejected": None, "commands": []}
        self.tour: dict[str, Any] = {"ran": False, "commands": []}
        self.nightly: dict[str, Any] = {"batch": None}
        self._servers: list[Any] = []
        self._conn: Any = None
        self._live: Live | None = None

    # -- helpers --------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def event(self, text: str) -> None:
        self.events.append((self.elapsed(), text))
        if not self.o.as_json and self._live is None:
            console.print(f"[dim]{self.elapsed():6.1f}s[/dim] {text}", highlight=False)

    async def query(self, name: str, *args: Any) -> list[tuple]:
        return await store.fetch_async(self._conn, store.Statement(name, getattr(queries_for(self.schema), name), args))

    def spawn(self, name: str, *args: str) -> Child:
        child = Child(name, list(args), self.env, self.cwd, self.run_dir)
        self.children.append(child)
        return child

    def spawn_worker(self) -> Child:
        worker = self.spawn(f"worker {len(self.workers) + 1}", "worker", APP_SPEC, "-c", str(self.o.concurrency),
                            "--lease", f"{WORKER_LEASE:g}", "--grace", "5", "--poll-interval", "0.5",
                            "--log-format", "json")
        self.workers.append(worker)
        return worker

    def spawn_relay(self) -> Child:
        n = sum(1 for c in self.children if c.name.startswith("relay"))
        self.relay = self.spawn(f"relay {n + 1}", "relay", APP_SPEC, "--lease", f"{RELAY_LEASE:g}", "--grace", "5",
                                "--poll-interval", "0.5", "--batch-size", "50", "--log-format", "json")
        return self.relay

    def check_children(self) -> None:
        for child in self.children:
            code = child.proc.poll()
            if code is not None and not child.expected_exit:
                raise DemoError(f"{child.name} (pid {child.pid}) exited with code {code}: {child.last_line()} "
                                f"(log: {child.log_path})")

    # -- services ---------------------------------------------------------------

    async def start_services(self) -> None:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # the demo handles signals itself
                yield

        apps = {"form": self.form, "crm": self.crm.app}
        if self.local_model is not None:
            apps["model"] = self.local_model.app
        for name, asgi in apps.items():
            server = Server(uvicorn.Config(asgi, log_level="error", access_log=False, lifespan="auto",
                                           server_header=False))
            task = asyncio.create_task(server.serve(sockets=[self.sockets[name]]), name=f"serve-{name}")
            self._servers.append((server, task))
        for server, task in self._servers:
            while not server.started:
                if task.done():
                    task.result()
                    raise DemoError("a local service stopped while starting")
                await asyncio.sleep(0.01)

    async def stop_services(self) -> None:
        for server, _ in self._servers:
            server.should_exit = True
        await asyncio.gather(*(t for _, t in self._servers), return_exceptions=True)

    # -- the workload -----------------------------------------------------------

    async def submit(self) -> None:
        """POST every lead to the form as a browser does, ``rate`` per second, a few at a time."""
        import httpx

        started = time.monotonic()
        limit = asyncio.Semaphore(8)
        async with httpx.AsyncClient(base_url=self.urls["form"], timeout=30.0) as client:
            async def one(lead: dict[str, str]) -> None:
                async with limit:
                    try:
                        response = await client.post("/leads", data=lead)
                    except httpx.HTTPError as exc:
                        self.refused.append(f"{lead['email']}: {type(exc).__name__}: {exc}")
                        return
                if response.status_code == 303:
                    self.accepted.append(int(response.headers["location"].rsplit("/", 1)[1]))
                else:
                    self.refused.append(f"{lead['email']}: HTTP {response.status_code}")

            sent = []
            for i, lead in enumerate(self.leads):
                sent.append(asyncio.create_task(one(lead)))
                await asyncio.sleep(max(0.0, started + (i + 1) / self.o.rate - time.monotonic()))
            await asyncio.gather(*sent)
        self.submit_seconds = time.monotonic() - started
        self.submitting = False
        self.event(f"submitted {len(self.accepted)} leads through the form in {self.submit_seconds:.1f}s"
                   + (f" ({len(self.refused)} refused)" if self.refused else ""))

    async def running_by_worker(self) -> dict[int, list[tuple[int, str]]]:
        """Running jobs per worker pid (a worker's name is host:pid:suffix)."""
        found: dict[int, list[tuple[int, str]]] = {}
        for job_id, kind, worker in await self.query("demo_running_jobs"):
            with contextlib.suppress(AttributeError, IndexError, ValueError):
                found.setdefault(int(worker.rsplit(":", 2)[1]), []).append((job_id, kind))
        return found

    async def crash_a_worker(self) -> None:
        """SIGKILL the worker with the most model calls in flight, once a quarter of the leads are classified."""
        target = max(1, len(self.leads) // 4)
        while True:
            await asyncio.sleep(0.2)
            classify = self.snapshot.jobs.get("classify", Counter())
            if classify["done"] + classify["held"] + classify["failed"] < target:
                continue
            live = {w.pid: w for w in self.workers if w.proc.poll() is None}
            busy = {pid: jobs for pid, jobs in (await self.running_by_worker()).items() if pid in live}
            if busy:
                pid = max(busy, key=lambda p: (sum(kind == "classify" for _, kind in busy[p]), len(busy[p])))
                if any(kind == "classify" for _, kind in busy[pid]) or classify["done"] >= 2 * target:
                    victim = live[pid]
                    break
        await victim.kill()
        jobs = (await self.running_by_worker()).get(victim.pid, [])  # left running under its name until rescued
        kinds = Counter(kind for _, kind in jobs)
        self.worker_crash.update(pid=victim.pid, jobs=[i for i, _ in jobs], kinds=dict(kinds))
        self.event(f"[red]SIGKILL[/red] {victim.name} (pid {victim.pid}) while it ran {_n(len(jobs), 'job')} "
                   f"({', '.join(f'{n} {k}' for k, n in kinds.items())}); their leases run out in {WORKER_LEASE:g}s")
        replacement = self.spawn_worker()
        self.worker_crash["done"] = True
        self.event(f"started {replacement.name} (pid {replacement.pid}) in its place")

    async def crash_the_relay(self) -> None:
        """SIGKILL the relay while the CRM holds a request it already acted on: sent, not marked sent."""
        await self.crm.stalled.wait()
        in_flight = [r[0] for r in await self.query("demo_outbox_leased")]
        old = self.relay
        await old.kill()
        self.crm.release()
        while self.crm.in_progress:  # requests that reached the CRM are handled, caller or not
            await asyncio.sleep(0.02)
        created = {c["external_id"] for c in self.crm.contacts}
        self.relay_crash.update(pid=old.pid, in_flight=in_flight,
                                already_in_crm=sorted(k for k in in_flight if k in created),
                                posts_before=Counter(c["external_id"] for c in self.crm.contacts))
        self.event(f"[red]SIGKILL[/red] {old.name} (pid {old.pid}) with {_n(len(in_flight), 'message')} in flight, "
                   f"{len(self.relay_crash['already_in_crm'])} of them already created in the CRM")
        new = self.spawn_relay()
        self.relay_crash["done"] = True
        self.event(f"started {new.name} (pid {new.pid}); it reads back before re-sending")

    async def reviewer(self) -> None:
        """A person's turn, through the CLI: release one held lead as qualified, reject another."""
        held = await asyncio.to_thread(self.app.held_jobs, None, limit=1000)
        if not held:
            return
        commands = [("released", held[0]["id"], ["release", str(held[0]["id"]), "--set", "decision=qualified",
                                                 "--note", "demo reviewer: checked by hand"])]
        if len(held) > 1:
            commands.append(("rejected", held[1]["id"], ["reject", str(held[1]["id"]), "--reason",
                                                         "demo reviewer: not enough to go on"]))
        for what, job_id, args in commands:
            await self.cli(*args, who="reviewer", commands=self.review["commands"])
            self.review[what] = job_id
            if what == "released":
                self.review["released_lead"] = held[0]["payload"]["lead_id"]

    async def cli(self, *args: str, who: str = "ai tour", commands: list[str] | None = None) -> str:
        """`joblane ARGS` as ``who`` would type it, kept in ``commands`` (the tour's by default) and shown as an
        event; its output (a failure stops the demo)."""
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "joblane", *args, env=self.env,
                                                    cwd=self.cwd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        shown = shlex.join(["joblane", *args])
        (self.tour["commands"] if commands is None else commands).append(shown)
        if proc.returncode != 0:
            raise DemoError(f"`{shown}` failed: {out.decode(errors='replace').strip()}")
        self.event(f"{who}: {escape(shown)}")
        return out.decode(errors="replace")

    async def _score_jobs_settle(self, deadline: float) -> None:
        """Wait until no score job is pending or running."""
        while time.monotonic() < deadline:
            self.check_children()
            [(unfinished, _)] = await self.query("demo_tour_unfinished")
            if unfinished == 0:
                return
            await asyncio.sleep(0.3)
        raise TimeoutError

    async def _acme_at_cap(self, deadline: float) -> dict[str, Any] | None:
        """Wait until tenant acme has spent its cap (settled) with score jobs held back; its budget row then."""
        from .. import admin

        while time.monotonic() < deadline:
            self.check_children()
            status = [b for b in await asyncio.to_thread(admin.budget_status, self.app) if b["key"] == "acme"]
            if status and status[0]["spent"] >= status[0]["cap"] and status[0]["waiting"] > 0:
                return status[0]
            [(unfinished, _)] = await self.query("demo_tour_unfinished")
            if unfinished == 0:
                return None
            await asyncio.sleep(0.3)
        raise TimeoutError

    async def ai_tour(self, deadline: float) -> None:
        """A spend cap reached and raised, a cached model call, a replay with a new prompt compared."""
        from joblane import JobSpec

        from .lead_intake import db

        lead_ids = [r["id"] for r in await db.rows(self._conn, "enriched_ids", self.schema, 7)]
        if len(lead_ids) < 2:
            return
        self.tour["ran"] = True
        # tenant acme scores 7 leads, the first twice; each call is estimated at (and costs) 0.001, the cap is 0.004
        specs = [JobSpec("score", {"lead_id": i, "tenant": "acme", "estimated_cost": 0.001}, queue="ai")
                 for i in [*lead_ids, lead_ids[0]]]
        with self.app.connect() as conn:
            ids = await asyncio.to_thread(self.app.enqueue_many, conn, specs)
        self.event(f"ai tour: {len(ids)} score jobs for tenant acme, under budget ai-spend (0.004 a day)")
        capped = await self._acme_at_cap(deadline)
        if capped is not None:
            self.tour["cap"] = {"budget": "ai-spend", "key": "acme", "spent": round(capped["spent"], 6),
                                "cap": capped["cap"], "waiting": capped["waiting"]}
            self.event(f"ai tour: acme spent {capped['spent']:g} of {capped['cap']:g}:"
                       f" {capped['waiting']} score jobs wait for the cap to rise")
            await self.cli("budgets", "set", "ai-spend", "--cap", "1")
            self.tour["cap"]["raised_to"] = 1.0
        await self._score_jobs_settle(deadline)
        jobs = [await asyncio.to_thread(self.app.get_job, i) for i in ids]
        metas = [a["meta"] or {} for job in jobs for a in job["attempt_rows"]]
        notes = [n for m in metas for n in m.get("cache", [])]
        self.tour["cache"] = {"calls": sum(1 for n in notes if not n["hit"]), "hits": sum(1 for n in notes if n["hit"]),
                              "cost_saved": round(sum(n.get("cost_saved", 0) for n in notes if n["hit"]), 6)}
        failed = sum(1 for job in jobs if job["state"] == "failed")
        if failed:
            await self.cli("replay", "--kind", "score", "--state", "failed", "--set", "prompt_version=score-v2",
                           "--tag", "score-v2", "--yes")
            await self._score_jobs_settle(deadline)
            report = await asyncio.to_thread(self.app.compare_replay, "score-v2")
            self.tour["compare"] = {"tag": "score-v2", "changed": report["changed"], "fixed": report["fixed"],
                                    "regressed": report["regressed"],
                                    **{side: {k: report[side][k] for k in ("jobs", "done", "failed", "success_rate",
                                                                            "cost", "latency_ms_per_job")}
                                       for side in ("original", "replay")}}
            self.event(f"ai tour: replayed {failed} failed scores with prompt score-v2:"
                       f" `joblane compare score-v2` shows {report['fixed']} fixed")

    async def nightly_run(self, deadline: float) -> None:
        """The night: a batch re-asks the model about every decided lead; its callback waits for a manager."""
        from .lead_intake import db
        from .lead_intake.app import start_nightly

        ids = [r["id"] for r in await db.rows(self._conn, "decided_ids", self.schema)]
        async with self._conn.transaction():
            batch = await start_nightly(self._conn, ids)
        self.nightly["batch"] = batch.id
        self.event(f"nightly: batch {batch.id} re-classifies {len(ids)} decided leads; "
                   "its callback job writes the digest")
        while True:  # the callback came (in the last completion's transaction) and waits for a sign-off
            progress = await asyncio.to_thread(self.app.batch_progress, batch.id)
            if progress["callback_job_id"] is not None:
                job = await asyncio.to_thread(self.app.get_job, progress["callback_job_id"])
                if job["state"] == "waiting":
                    break
                if job["state"] in ("failed", "cancelled"):
                    raise DemoError(f"the nightly digest job {job['id']} {job['state']}: {job['last_error']}")
            if time.monotonic() > deadline:
                raise TimeoutError
            self.check_children()
            await asyncio.sleep(0.2)
        self.nightly["digest_job"] = progress["callback_job_id"]
        signed: list[str] = []
        await self.cli("signal", f"digest-approved:{batch.id}", "--data", json.dumps({"by": "demo manager"}),
                       who="manager", commands=signed)
        self.nightly["signal"] = signed[0]
        while (await asyncio.to_thread(self.app.get_job, progress["callback_job_id"]))["state"] != "done":
            if time.monotonic() > deadline:
                raise TimeoutError
            self.check_children()
            await asyncio.sleep(0.2)
        self.nightly["progress"] = await asyncio.to_thread(self.app.batch_progress, batch.id)

    # -- watching -----------------------------------------------------------------

    async def refresh(self) -> None:
        snap = Snapshot()
        for kind, state, n in await self.query("demo_job_counts"):
            snap.jobs.setdefault(kind, Counter())[state] = n
        for state, n, retried in await self.query("demo_outbox_counts"):
            snap.outbox[state] = n
            snap.outbox_retried += retried
        for kind, outcome, status, tries, tokens_in, tokens_out, latency, timed in await self.query(
                "demo_attempt_counts"):
            if outcome == "lost":
                snap.model["lost"] += tries
            if kind != "classify" or status is None:
                continue
            snap.model["calls"] += tries
            snap.model[f"status_{status}"] += tries
            snap.model["tokens_in"] += tokens_in or 0
            snap.model["tokens_out"] += tokens_out or 0
            snap.model["latency_ms"] += latency or 0
            snap.model["timed"] += timed
        self.snapshot = snap

    def settled(self) -> bool:
        """Every lead submitted, no job pending or running, no message unsent, no crash half done."""
        if self.submitting or self.snapshot.unfinished or self.snapshot.outbox["pending"]:
            return False
        return not (self.crm.stalled.is_set() and not self.relay_crash["done"])

    async def watch_until_settled(self, deadline: float) -> None:
        while True:
            self.check_children()
            await self.refresh()
            if self._live is not None:
                self._live.update(self.render())
            if self.settled():
                return
            if time.monotonic() > deadline:
                raise TimeoutError
            await asyncio.sleep(0.4)

    def render(self, events: bool = True) -> Panel:
        s = self.snapshot
        jobs = Table(box=None, pad_edge=False, header_style="bold")
        jobs.add_column("job")
        for state in SHOWN_STATES:
            jobs.add_column(state, justify="right")
        for kind in JOB_KINDS:
            c = s.jobs.get(kind, Counter())
            jobs.add_row(kind, *[str(c[state]) if c[state] else "[dim]·[/dim]" for state in SHOWN_STATES])
        m = s.model
        header = f"leads   [bold]{len(self.accepted)}[/bold]/{len(self.leads)} submitted through {self.urls['form']}"
        facts = [
            f"outbox  sent [bold]{s.outbox['sent']}[/bold]  pending {s.outbox['pending']}  failed {s.outbox['failed']}"
            f"   CRM contacts [bold]{len(self.crm.contacts)}[/bold]",
            f"model   calls {m['calls']}  [yellow]429s absorbed {m['status_429']}[/yellow]  5xx retried "
            f"{m['status_503']}  tokens {m['tokens_in']:,} in / {m['tokens_out']:,} out",
            f"review  held [bold]{s.jobs.get('classify', Counter())['held']}[/bold]   jobs of lost workers "
            f"rescued {m['lost']}",
        ]
        parts = [Text.from_markup(header), jobs, Text.from_markup("\n".join(facts))]
        if events:
            shown = [f"[dim]{t:6.1f}s[/dim] {text}" for t, text in self.events[-7:]]
            parts.append(Text.from_markup("\n".join(shown) or "[dim]starting...[/dim]"))
        return Panel(Group(*parts),
                     title=f"joblane demo · lead intake · schema {self.schema} · {self.elapsed():.1f}s",
                     title_align="left")

    # -- the whole run ----------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        import psycopg

        deadline = self.started + self.o.timeout
        self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        try:
            await self.start_services()
            self.spawn_relay()
            for _ in range(self.o.workers):
                self.spawn_worker()
            self.event(f"started {self.o.workers} workers and the relay (pids "
                       f"{', '.join(str(c.pid) for c in self.children)}); logs in {self.run_dir}")
            background = [asyncio.create_task(self.submit(), name="submit")]
            if self.o.chaos:
                self.crm.stall_after(max(1, min(10, len(self.leads) // 20)))
                background.append(asyncio.create_task(self.crash_a_worker(), name="crash-worker"))
                background.append(asyncio.create_task(self.crash_the_relay(), name="crash-relay"))
            # on a terminal a live panel; elsewhere (a pipe, a CI log) one line per event and the panel at the end
            live = (Live(self.render(), console=console, refresh_per_second=4, transient=False)
                    if console.is_terminal and not self.o.as_json else contextlib.nullcontext())
            with live as self._live:
                try:
                    await self._watch(background, deadline)
                    for task in background[1:]:  # a crash that found no moment before the end does not happen
                        task.cancel()
                    self.crm.stall_after(None)
                    if self.o.review:
                        await self.reviewer()
                        await self._watch(background, deadline)
                    if self.o.ai_tour:
                        await self.ai_tour(deadline)
                    if self.o.nightly:
                        await self.nightly_run(deadline)
                        await self._watch(background, deadline)
                finally:
                    for task in background:
                        task.cancel()
                    await asyncio.gather(*background, return_exceptions=True)
                    await self.refresh()
                    if self._live is not None:
                        self._live.update(self.render())
                    elif not self.o.as_json:
                        console.print(self.render(events=False))
            self._live = None
            return await self.summary(timed_out=False)
        except TimeoutError:
            self._live = None
            return await self.summary(timed_out=True)

    async def _watch(self, background: list[asyncio.Task], deadline: float) -> None:
        waiting = asyncio.create_task(self.watch_until_settled(deadline))
        try:
            while not waiting.done():
                await asyncio.wait([waiting, *[t for t in background if not t.done()]],
                                   return_when=asyncio.FIRST_COMPLETED)
                for task in background:  # a failed helper stops the run with its reason
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()
            waiting.result()
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)

    async def shutdown(self) -> None:
        self.crm.release()
        await asyncio.gather(*(c.stop() for c in self.children), return_exceptions=True)
        await self.stop_services()
        if self._conn is not None:
            await self._conn.close()

    # -- the summary --------------------------------------------------------------------

    async def summary(self, *, timed_out: bool) -> dict[str, Any]:
        from .lead_intake import db

        await self.refresh()
        outcomes = await db.rows(self._conn, "outcomes", self.schema)
        contacts = list(self.crm.contacts)
        per_key = Counter(c["external_id"] for c in contacts)
        per_email = Counter(c["email"] for c in contacts)
        qualified_keys = {f"lead-{o['id']}" for o in outcomes if o["status"] == "qualified"}
        buckets: Counter[str] = Counter()
        not_qualified: Counter[str] = Counter()
        failures: Counter[str] = Counter()
        held_ids, rejected, unaccounted = [], [], []
        for o in outcomes:
            key = f"lead-{o['id']}"
            if o["status"] == "qualified":
                if per_key[key] >= 1:
                    buckets["in_crm"] += 1
                else:
                    unaccounted.append(f"lead {o['id']}: qualified, not in the CRM")
            elif o["status"] == "not_qualified":
                buckets["not_qualified"] += 1
                c = o["classification"] or {}
                intent = c.get("intent", "?")
                not_qualified[f"{intent}, {c.get('fit')} fit" if intent == "buying" else intent] += 1
            elif o["job_state"] == "held":
                buckets["held"] += 1
                held_ids.append(o["id"])
            elif o["job_state"] == "cancelled":
                buckets["rejected"] += 1
                rejected.append(o["id"])
            elif o["job_state"] == "failed":
                buckets["failed"] += 1
                reason = (o["job_error"] or "no reason recorded").removeprefix("PermanentError: ")
                failures[f"{o['job_kind']}: {reason}"] += 1
            else:
                unaccounted.append(f"lead {o['id']}: {o['job_kind']} job {o['job_state']}")
        duplicates = sum(n - 1 for n in per_key.values() if n > 1) + sum(n - 1 for n in per_email.values() if n > 1)
        unexpected = sorted(k for k in per_key if k not in qualified_keys)
        m = self.snapshot.model
        worker_crash = dict(self.worker_crash)
        if worker_crash.get("jobs"):
            rows = await self.query("demo_job_outcomes", worker_crash["jobs"])
            worker_crash["rescued"] = sum(1 for _, _, outs in rows if outs and "lost" in outs)
            worker_crash["finished"] = sum(1 for _, state, _ in rows if state not in ("pending", "running"))
        review = dict(self.review)
        if review["released_lead"] is not None:
            review["released_in_crm"] = per_key[f"lead-{review['released_lead']}"] == 1
        relay_crash = dict(self.relay_crash)
        if relay_crash.get("in_flight") is not None:
            before = relay_crash.pop("posts_before")
            relay_crash["posted_again"] = sum(per_key[k] - before[k] for k in relay_crash["already_in_crm"])
        else:
            relay_crash.pop("posts_before", None)
        nightly: dict[str, Any] = {"batch": self.nightly["batch"]}
        if self.nightly["batch"] is not None:
            progress = self.nightly.get("progress") or self.app.batch_progress(self.nightly["batch"])
            digest = await db.one(self._conn, "get_digest", self.schema, self.nightly["batch"])
            nightly.update(leads=progress["total"], answered=progress["done"], failed=progress["failed"],
                           callback_job=progress["callback_job_id"], signal=self.nightly.get("signal"),
                           digest=None if digest is None else {"changed": digest["summary"]["changed"],
                                                                "approved_by": digest["approved_by"]})
            if digest is None and not timed_out:
                unaccounted.append(f"nightly batch {self.nightly['batch']}: no digest written")
        accounted = (not timed_out and not unaccounted and not self.refused and duplicates == 0 and not unexpected
                     and len(outcomes) == len(self.accepted) == len(self.leads))
        return {
            "accounted": accounted,
            "timed_out": timed_out,
            "database": self.database,
            "schema": self.schema,
            "leads_requested": len(self.leads),
            "leads_in": len(outcomes),
            "form_refused": self.refused,
            "qualified": len(qualified_keys),
            "contacts": len(contacts),
            "duplicates": duplicates,
            "unexpected_contacts": unexpected,
            "not_qualified": buckets["not_qualified"],
            "not_qualified_by_intent": dict(not_qualified.most_common()),
            "held": buckets["held"],
            "held_lead_ids": held_ids,
            "rejected": buckets["rejected"],
            "failed": buckets["failed"],
            "failures": [{"reason": r, "leads": n} for r, n in failures.most_common()],
            "unaccounted": unaccounted,
            "review": review,
            "nightly": nightly,
            "model": {
                "local": self.local_model is not None,
                "calls": m["calls"], "answered": m["status_200"], "rate_limited_429": m["status_429"],
                "server_errors_retried": m["status_503"], "tokens_in": m["tokens_in"], "tokens_out": m["tokens_out"],
                "mean_latency_ms": round(m["latency_ms"] / m["timed"]) if m["timed"] else None,
            },
            "outbox": {**{state: self.snapshot.outbox[state] for state in ("sent", "pending", "failed")},
                       "took_more_than_one_try": self.snapshot.outbox_retried},
            "crm": {"posts": self.crm.stats["posts"], "refused_503": self.crm.stats["errors_503"],
                    "read_back_searches": self.crm.stats["searches"]},
            "worker_crash": worker_crash,
            "relay_crash": relay_crash,
            "ai_tour": self.tour,
            "submit_seconds": round(self.submit_seconds, 2),
            "wall_seconds": round(self.elapsed(), 2),
            "logs": str(self.run_dir),
        }


# -- output -------------------------------------------------------------------------------


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def print_summary(s: dict[str, Any], wall: float) -> None:
    table = Table(title="lead intake: where every lead went", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("leads in", f"{s['leads_in']} of {s['leads_requested']} through the web form"
                  + (f"; [red]{len(s['form_refused'])} refused[/red]" if s["form_refused"] else ""))
    dup = "[green]no duplicates[/green]" if s["duplicates"] == 0 else f"[red]{s['duplicates']} duplicates[/red]"
    table.add_row("in the CRM", f"{s['contacts']} contacts for {s['qualified']} qualified leads, {dup}"
                  + (f"; [red]{len(s['unexpected_contacts'])} unexpected[/red]" if s["unexpected_contacts"] else ""))
    by_intent = ", ".join(f"{k} {n}" for k, n in s["not_qualified_by_intent"].items())
    table.add_row("not qualified", f"{s['not_qualified']}" + (f" ({by_intent})" if by_intent else ""))
    table.add_row("held for review", f"{s['held']}" + ("  → joblane held" if s["held"] else ""))
    review = s["review"]
    if review["commands"]:
        landed = ""
        if review.get("released_lead") is not None:
            landed = (f"\nlead {review['released_lead']} reached the CRM" if review.get("released_in_crm")
                      else f"\n[red]lead {review['released_lead']} did not reach the CRM[/red]")
        table.add_row("reviewed", "\n".join(escape(c) for c in review["commands"]) + landed)
    n = s.get("nightly") or {}
    if n.get("batch") is not None:
        digest = n.get("digest")
        table.add_row("nightly batch", f"batch {n['batch']}: {n['answered']} of {n['leads']} decided leads asked again"
                      + (f", {n['failed']} failed" if n["failed"] else "")
                      + (f"; {_n(len(digest['changed']), 'answer')} changed; the callback (job {n['callback_job']}) waited "
                         f"for {escape(n['signal'] or '')} and wrote the digest" if digest else
                         "; [red]no digest[/red]"))
    if s["failures"]:
        table.add_row("failed", "\n".join(f"{f['leads']} × {escape(f['reason'])}" for f in s["failures"]))
    else:
        table.add_row("failed", "0")
    m = s["model"]
    latency = f", mean latency {m['mean_latency_ms']} ms" if m["mean_latency_ms"] is not None else ""
    table.add_row("model calls", f"{m['calls']} calls: {m['answered']} answered, {m['rate_limited_429']} × 429 "
                  "absorbed (retried when Retry-After said, no attempt spent), "
                  f"{m['server_errors_retried']} × 5xx retried; "
                  f"{m['tokens_in']:,} tokens in, {m['tokens_out']:,} out{latency}")
    o, crm = s["outbox"], s["crm"]
    table.add_row("outbox", f"{o['sent']} sent, {o['pending']} pending, {o['failed']} failed; "
                  f"{o['took_more_than_one_try']} needed another try (CRM: {crm['posts']} POSTs, "
                  f"{crm['refused_503']} refused with 503, {crm['read_back_searches']} read-back searches)")
    w = s["worker_crash"]
    if w.get("pid"):
        table.add_row("worker killed", f"pid {w['pid']} with {_n(len(w['jobs']), 'job')} running: "
                      f"{w.get('rescued', 0)} came back when their lease ran out (attempt recorded as lost), "
                      f"{w.get('finished', 0)} finished")
    r = s["relay_crash"]
    if r.get("pid"):
        found, rest = len(r["already_in_crm"]), len(r["in_flight"]) - len(r["already_in_crm"])
        table.add_row("relay killed", f"pid {r['pid']} with {_n(len(r['in_flight']), 'message')} in flight, "
                      f"{found} already created in the CRM but not marked sent: read-back found "
                      f"{'it' if found == 1 else 'them'} ({r['posted_again']} posted twice)"
                      + (f"; {rest} sent again" if rest else ""))
    t = s.get("ai_tour") or {}
    if t.get("cap"):
        c = t["cap"]
        table.add_row("spend cap", f"budget {c['budget']}: tenant {c['key']} spent {c['spent']:g} of {c['cap']:g} a day "
                      f"and {_n(c['waiting'], 'score job')} waited (pending, claimed by no worker) until "
                      f"`joblane budgets set {c['budget']} --cap {c.get('raised_to', 0):g}` raised it")
    if t.get("cache"):
        c = t["cache"]
        table.add_row("cached model call", f"{c['calls']} calls made for the score jobs, {c['hits']} answered from "
                      f"the step cache (cost saved {c['cost_saved']:g})")
    if t.get("compare"):
        c = t["compare"]

        def side(d: dict) -> str:
            rate = "-" if d["success_rate"] is None else f"{d['success_rate'] * 100:.0f}%"
            return f"{d['done']}/{d['jobs']} done ({rate}), cost {d['cost'] or 0:g}"

        table.add_row("replay compared", f"`joblane compare {c['tag']}`: first prompt {side(c['original'])}; "
                      f"second prompt {side(c['replay'])}; {c['fixed']} fixed, {c['regressed']} lost, "
                      f"{c['changed']} changed")
    table.add_row("wall time", f"{wall:.1f}s ({s['database']}, schema {s['schema']})")
    if s["accounted"]:
        table.add_row("verdict", "[green]every lead is accounted for[/green]")
    else:
        problems = s["unaccounted"][:10] + (["timed out before the run settled"] if s["timed_out"] else [])
        table.add_row("verdict", "[red]not every lead is accounted for[/red]\n" + "\n".join(map(escape, problems)))
    console.print(table)
    console.print(f"[dim]worker and relay logs: {s['logs']}[/dim]")


# -- the run ---------------------------------------------------------------------------------------


def run(dsn: str | None, schema: str | None, options: Options) -> int:
    """One run of the demo on ``dsn`` (None: an embedded PostgreSQL) in ``schema``; the exit code.

    Raises DemoError when it cannot go on.
    """
    from ..queries import validate_schema

    schema = schema or DEFAULT_SCHEMA

    try:
        validate_schema(schema)
    except ValueError as exc:
        raise DemoError(str(exc)) from None
    if os.environ.get("OPENAI_BASE_URL") and not os.environ.get("OPENAI_API_KEY"):
        raise DemoError("OPENAI_BASE_URL is set but OPENAI_API_KEY is not: set both (and LEAD_INTAKE_MODEL), "
                   "or neither to use the local model server")
    wall_start = time.monotonic()
    say = (lambda text: None) if options.as_json else (lambda text: console.print(text, highlight=False))
    if dsn:
        database = "DATABASE_URL"
    else:
        say("DATABASE_URL is not set: starting an embedded PostgreSQL...")
        import warnings

        from ..testing import database_url

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                dsn = database_url()
            except Exception as exc:
                raise DemoError(f"cannot start the embedded PostgreSQL ({exc}): set DATABASE_URL instead") from None
        database = "embedded PostgreSQL"
    leads = _load_leads(options.leads)
    _reset_schema(dsn, schema)

    # Where everything listens, decided before the example is imported (its settings read the environment).
    sockets = {"form": _listen(options.port), "crm": _listen()}
    urls = {name: f"http://127.0.0.1:{sock.getsockname()[1]}" for name, sock in sockets.items()}
    env = dict(os.environ)
    local_model = not os.environ.get("OPENAI_BASE_URL")
    if local_model:
        sockets["model"] = _listen()
        urls["model"] = f"http://127.0.0.1:{sockets['model'].getsockname()[1]}"
        env.update(OPENAI_BASE_URL=urls["model"] + "/v1", OPENAI_API_KEY="local", LEAD_INTAKE_MODEL=LOCAL_MODEL)
    env.update(DATABASE_URL=dsn, JOBLANE_SCHEMA=schema, LEAD_INTAKE_CRM_URL=urls["crm"])
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "JOBLANE_SCHEMA", "LEAD_INTAKE_CRM_URL", "OPENAI_BASE_URL",
                                           "OPENAI_API_KEY", "LEAD_INTAKE_MODEL") if k in env})

    from .lead_intake import local_crm
    from .lead_intake import local_model as local_model_module
    from .lead_intake.app import app
    from .lead_intake.form import create_form

    run_dir = Path(tempfile.mkdtemp(prefix="joblane-demo-"))
    demo = Demo(options, dsn=dsn, schema=schema, database=database, cwd=Path.cwd(), run_dir=run_dir, leads=leads,
                env=env, sockets=sockets, urls=urls,
                local_model=local_model_module.LocalModel() if local_model else None,
                crm=local_crm.LocalCrm(), app=app, form=create_form(app, dsn))
    say(f"[bold]joblane demo[/bold]: {len(leads)} leads → form {urls['form']} → enrich → classify "
        f"({'local model ' + urls['model'] if local_model else os.environ['OPENAI_BASE_URL']}) → deliver → "
        f"relay → CRM {urls['crm']}   [dim]({database}, schema {schema})[/dim]")
    return asyncio.run(_main(demo, options, wall_start))


async def _main(demo: Demo, options: Options, wall_start: float) -> int:
    main = asyncio.current_task()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)  # like Ctrl-C: stop and clean up
    try:
        try:
            summary = await demo.run()
        except asyncio.CancelledError:
            if not options.as_json:
                console.print("[yellow]stopped before the end[/yellow]")
            return 130
        summary["wall_seconds"] = round(time.monotonic() - wall_start, 2)
        if options.as_json:
            print(json.dumps(summary, default=str), flush=True)
        else:
            print_summary(summary, summary["wall_seconds"])
        code = 0 if summary["accounted"] else 1
        if options.serve:
            with contextlib.suppress(asyncio.CancelledError):
                await serve_forever(demo)
        return code
    finally:
        await demo.shutdown()


async def serve_forever(demo: Demo) -> None:
    try:
        port = free_port(8787)
    except OSError:
        raise DemoError("no free port on 127.0.0.1 for the dashboard") from None
    demo.spawn("dashboard", "dashboard", APP_SPEC, "--port", str(port))
    shell = f"export DATABASE_URL='{demo.dsn}' JOBLANE_SCHEMA={demo.schema}"
    lines = [
        "",
        "[bold]Everything keeps running[/bold] (Ctrl-C stops it):",
        f"  web form   {demo.urls['form']}/",
        f"  dashboard  http://127.0.0.1:{port}/",
        f"  CRM        {demo.urls['crm']}/contacts",
    ]
    if "model" in demo.urls:
        lines.append(f"  model      {demo.urls['model']}/v1/chat/completions")
    lines += [
        "In another shell, from this directory:",
        f"  {shell}",
        "  .venv/bin/joblane held                                    # the review queue",
        "  .venv/bin/joblane release ID                              # accept the model's answer",
        "  .venv/bin/joblane release ID --set decision=qualified     # or decide: qualified / not_qualified",
        "  .venv/bin/joblane reject ID --reason 'not a lead'",
        "  .venv/bin/joblane jobs --state failed",
    ]
    console.print("\n".join(escape(line) if line.startswith("  ") else line for line in lines), highlight=False,
                  soft_wrap=True)
    seen = len(demo.crm.contacts)
    while True:
        await asyncio.sleep(1.0)
        try:
            demo.check_children()
        except DemoError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
            return
        for contact in demo.crm.contacts[seen:]:
            console.print(f"CRM: new contact {contact['email']} ({contact['external_id']})", highlight=False)
        seen = len(demo.crm.contacts)
