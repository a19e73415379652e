"""Traces, metrics and one log line per job outcome. Each is optional and costs next to nothing when off.

Traces (``pip install 'joblane[telemetry]'``, OpenTelemetry API): spans
around enqueue, publish, claim, run and outbox delivery. The W3C trace
context of an enqueue is stored in the job's ``headers`` column (never in
its payload) and becomes the parent of the job's run span; a publish adds
``traceparent`` to the outbox row's headers, so the relay's delivery span
continues the trace and the broker receives it. A trace thus goes from the
web request to the worker to the broker. Nothing is recorded until the
application installs an OpenTelemetry SDK (until then joblane skips the
work entirely); ``headers`` stays NULL while no span is active.

Metrics (prometheus-client): ``joblane worker --metrics-port 9464`` serves
``/metrics`` (see :func:`serve_metrics`); ``joblane relay --metrics-port
9465`` serves the relay's (see :func:`serve_relay_metrics`).

Logs: the logger ``joblane.jobs`` writes one line per job outcome at INFO,
with its fields under ``record.joblane`` (``--log-format json`` prints them
as JSON keys).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from .rules import install_hint

if TYPE_CHECKING:  # pragma: no cover
    from .types import Job, Outcome

try:
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # the [telemetry] extra is not installed: every span is a no-op
    _trace = None

job_log = logging.getLogger("joblane.jobs")

_NULL = contextlib.nullcontext()
_SYSTEM = "joblane"
_CLAIM_IDS_SHOWN = 100
_provider: Any = None  # set_tracer_provider(); None: OpenTelemetry's global provider
_cached: tuple[Any, Any] = (None, None)  # (provider, its tracer, or None when it records nothing)
# No provider set, and none to load from the environment on first use (the API's own rule).
_FAST_UNSET = (_trace is not None and hasattr(_trace, "_TRACER_PROVIDER")
               and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ)


def set_tracer_provider(provider: Any) -> None:
    """Make joblane's spans with ``provider`` instead of OpenTelemetry's global one (None: the global again)."""
    global _provider
    _provider = provider


def _tracer() -> Any:
    """joblane's tracer, or None while no SDK is set up (the API alone records nothing: skip the work)."""
    global _cached
    if _trace is None:
        return None
    provider = _provider
    if provider is None:
        # get_tracer_provider() reads os.environ on every call while no provider
        # is set; this check keeps an enqueue without tracing within a microsecond.
        if _FAST_UNSET and _trace._TRACER_PROVIDER is None:
            return None
        provider = _trace.get_tracer_provider()
    if provider is not _cached[0]:
        live = not isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider))
        _cached = (provider, provider.get_tracer("joblane") if live else None)
    return _cached[1]


def tracing() -> bool:
    """Whether spans are being recorded: the OpenTelemetry API is installed and an SDK is set up."""
    return _tracer() is not None


def _carrier() -> dict[str, str]:
    """The current trace context as headers (``traceparent``, ``tracestate``), empty when no span is active."""
    if not _trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return carrier


# -- enqueue and publish (the caller's process) -----------------------------


def enqueue_span(kind: str, queue: str, count: int = 1) -> contextlib.AbstractContextManager[str | None]:
    """A producer span around an enqueue; yields the ``headers`` JSON to store with the job(s), or None."""
    tracer = _tracer()
    if tracer is None:
        return _NULL
    return _enqueue(tracer, kind, queue, count)


@contextlib.contextmanager
def _enqueue(tracer: Any, kind: str, queue: str, count: int) -> Iterator[str | None]:
    attributes = {"messaging.system": _SYSTEM, "messaging.operation.type": "send",
                  "messaging.destination.name": queue, "joblane.job.kind": kind}
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with tracer.start_as_current_span(f"enqueue {kind}", kind=SpanKind.PRODUCER, attributes=attributes):
        carrier = _carrier()
        yield json.dumps(carrier, separators=(",", ":")) if carrier else None


def publish_span(topic: str, headers: Mapping[str, str] | None) -> contextlib.AbstractContextManager[Any]:
    """A producer span around a publish; yields the headers to store: the caller's plus ``traceparent``.

    A ``traceparent`` the caller set is kept.
    """
    tracer = _tracer()
    if tracer is None:
        return contextlib.nullcontext(headers)
    return _publish(tracer, topic, headers)


@contextlib.contextmanager
def _publish(tracer: Any, topic: str, headers: Mapping[str, str] | None) -> Iterator[Any]:
    attributes = {"messaging.system": _SYSTEM, "messaging.operation.type": "send",
                  "messaging.destination.name": topic}
    with tracer.start_as_current_span(f"publish {topic}", kind=SpanKind.PRODUCER, attributes=attributes):
        carrier = _carrier()
        if not carrier or (headers is not None and not isinstance(headers, Mapping)):
            yield headers  # bad headers are reported by publish itself
        else:
            yield {**carrier, **(headers or {})}


# -- the worker -------------------------------------------------------------


def claim_span(rows: Sequence[Any], started_ns: int, queues: Sequence[str]) -> None:
    """Record a claim that leased jobs (empty polls make no span), from ``started_ns`` until now."""
    if not rows:
        return
    tracer = _tracer()
    if tracer is None:
        return
    span = tracer.start_span(
        "claim", kind=SpanKind.CONSUMER, start_time=started_ns,
        attributes={"messaging.system": _SYSTEM, "messaging.operation.type": "receive",
                    "messaging.batch.message_count": len(rows), "joblane.queues": list(queues),
                    "joblane.job.ids": [r[0] for r in rows[:_CLAIM_IDS_SHOWN]]})
    span.end()


def run_span(job: Job, headers: str | None) -> contextlib.AbstractContextManager[Any]:
    """A consumer span around one try of a job, child of the span that enqueued it."""
    tracer = _tracer()
    if tracer is None:
        return _NULL
    return _run(tracer, job, headers)


@contextlib.contextmanager
def _run(tracer: Any, job: Job, headers: str | None) -> Iterator[Any]:
    parent = None
    if headers:
        try:
            parent = _propagate.extract(json.loads(headers))
        except ValueError:
            parent = None
    attributes = {"messaging.system": _SYSTEM, "messaging.operation.type": "process",
                  "messaging.destination.name": job.queue, "messaging.message.id": str(job.id),
                  "joblane.job.kind": job.kind, "joblane.job.attempt": job.attempt}
    with tracer.start_as_current_span(f"run {job.kind}", context=parent, kind=SpanKind.CONSUMER,
                                       attributes=attributes) as span:
        yield span


def end_run(span: Any, outcome: Outcome) -> None:
    """Mark the run span with the outcome; an error or a give-up sets its status to ERROR."""
    if span is None:
        return
    span.set_attribute("joblane.outcome", outcome.outcome)
    if outcome.outcome in ("retry", "failed"):
        span.set_status(Status(StatusCode.ERROR, outcome.error or outcome.outcome))


def job_finished(worker: Any, job: Job, outcome: Outcome, headers: str | None = None, *, quiet: bool = False) -> None:
    """Metrics and the log line of one outcome (called by the worker before the completer writes it).

    ``headers`` are the job's: the log line carries the trace id of the enqueue that started it.
    """
    metrics = getattr(worker, "metrics", None)
    if metrics is not None:
        metrics.observe(job, outcome)
    # done is the common case and logs at DEBUG (`joblane worker -v`), so a busy
    # worker is not slowed by a line per job; retries, holds and failures at INFO/WARNING
    if outcome.outcome == "done" or quiet:  # quiet: a give-back the worker already explained once
        level = logging.DEBUG
    elif outcome.state == "failed":
        level = logging.WARNING
    else:
        level = logging.INFO
    if job_log.isEnabledFor(level):
        seconds = outcome.finished_at - outcome.started_at \
            if outcome.finished_at and outcome.started_at else None
        fields = {"job_id": job.id, "kind": job.kind, "queue": job.queue, "attempt": job.attempt,
                  "max_attempts": job.max_attempts, "outcome": outcome.outcome, "state": outcome.state,
                  "seconds": round(seconds, 6) if seconds is not None else None}
        if outcome.error:
            fields["error"] = outcome.error
        if outcome.delay and outcome.state == "pending":
            fields["retry_in"] = round(outcome.delay, 3)
        if headers:
            parent = json.loads(headers).get("traceparent", "")
            if parent.count("-") == 3:
                fields["trace_id"] = parent.split("-")[1]
        # how long the try ran, and when the next one starts: "retry (ran 0.001s, next try in 0.768s)"
        notes = [f"ran {seconds:.3f}s"] if seconds is not None else []
        if "retry_in" in fields:
            notes.append(f"next try in {outcome.delay:.3f}s")
        took = f" ({', '.join(notes)})" if notes else ""
        why = f": {outcome.error}" if outcome.error else ""
        job_log.log(level, "job %d %s (%s) attempt %d/%d: %s%s%s", job.id, job.kind, job.queue, job.attempt,
                     job.max_attempts, outcome.outcome, took, why, extra={"joblane": fields})


# -- the relay --------------------------------------------------------------


def delivered(outcomes: Sequence[Any], started_ns: int) -> None:
    """One producer span per delivered outbox row, from ``started_ns`` until now, child of its publish span.

    ``outcomes`` are the relay's: each has ``message`` (with ``headers``),
    ``outcome`` (sent, retry, failed, released) and ``error``.
    """
    if not outcomes:
        return
    tracer = _tracer()
    if tracer is None:
        return
    for o in outcomes:
        m = o.message
        parent = _propagate.extract(m.headers) if m.headers else None
        span = tracer.start_span(
            f"deliver {m.topic}", context=parent, kind=SpanKind.PRODUCER, start_time=started_ns,
            attributes={"messaging.system": _SYSTEM, "messaging.operation.type": "send",
                        "messaging.destination.name": m.topic, "messaging.message.id": m.idempotency_key,
                        "joblane.outbox.id": m.id, "joblane.outbox.attempt": m.attempt,
                        "joblane.outcome": o.outcome})
        if o.outcome in ("retry", "failed"):
            span.set_status(Status(StatusCode.ERROR, o.error or o.outcome))
        span.end()


def now_ns() -> int:
    return time.time_ns()


# -- Prometheus -------------------------------------------------------------


class _Served:
    """A registry served over HTTP by ``serve_metrics`` / ``serve_relay_metrics``."""

    registry: Any
    server: Any = None
    port: int | None = None

    def close(self) -> None:
        """Stop serving (``serve_metrics`` started the server)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class WorkerMetrics(_Served):
    """The metrics of one worker, in their own registry (so tests may run several workers in a process).

    * ``joblane_jobs_total{queue,kind,outcome}``: tries by outcome (done, retry, snoozed, failed, held);
    * ``joblane_job_duration_seconds{queue,kind}``: how long tries ran;
    * ``joblane_jobs_running``: tries running now;
    * ``joblane_completions_stale_total``: outcomes that arrived after their job was rescued or cancelled;
    * ``joblane_event_loop_stalls_total``, ``joblane_event_loop_blocked_seconds_total``: tasks that blocked the loop.
    """

    def __init__(self, worker: Any):
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError:  # pragma: no cover - the [telemetry] extra is missing
            from .errors import JoblaneError

            raise JoblaneError(f"--metrics-port needs prometheus-client: {install_hint('telemetry')}") from None
        self.registry = CollectorRegistry(auto_describe=True)
        self.jobs = Counter("joblane_jobs_total", "Job tries by outcome.", ["queue", "kind", "outcome"],
                            registry=self.registry)
        self.duration = Histogram("joblane_job_duration_seconds", "How long job tries ran.", ["queue", "kind"],
                                  registry=self.registry,
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
        running = Gauge("joblane_jobs_running", "Job tries running now.", registry=self.registry)
        running.set_function(lambda: len(worker.active_jobs))
        self.registry.register(_StaleCollector(worker))

    def observe(self, job: Job, outcome: Outcome) -> None:
        self.jobs.labels(job.queue, job.kind, outcome.outcome).inc()
        if outcome.started_at is not None and outcome.finished_at is not None:
            self.duration.labels(job.queue, job.kind).observe(
                outcome.finished_at - outcome.started_at)


class _StaleCollector:
    """Read at scrape time from the worker's own counters: nothing on the hot path."""

    def __init__(self, worker: Any):
        self.worker = worker

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield CounterMetricFamily("joblane_completions_stale",
                                  "Outcomes that arrived after their job was rescued or cancelled.",
                                  value=self.worker.stats.get("stale", 0))
        pruner = getattr(self.worker, "pruner", None)
        if pruner is not None:
            yield CounterMetricFamily("joblane_pruned_jobs", "Finished jobs this worker's pruner deleted.",
                                      value=pruner.total)
            yield GaugeMetricFamily("joblane_pruner_behind",
                                    "1 while the pruner has more history to delete than its last round took.",
                                    value=1.0 if pruner.behind else 0.0)
        vacuumer = getattr(self.worker, "vacuumer", None)
        if vacuumer is not None:
            yield CounterMetricFamily("joblane_vacuums", "Vacuums of jobs this worker ran (dead row versions piled up).",
                                      value=vacuumer.total)
            yield CounterMetricFamily("joblane_vacuum_seconds", "Seconds this worker spent in those vacuums.",
                                      value=vacuumer.seconds)
        yield CounterMetricFamily("joblane_event_loop_stalls",
                                  "Times a task blocked the worker's event loop for --stall-warning seconds or more.",
                                  value=self.worker.stats.get("loop_stalls", 0))
        yield CounterMetricFamily("joblane_event_loop_blocked_seconds",
                                  "Seconds the worker's event loop spent blocked in those stalls.",
                                  value=self.worker.stats.get("loop_stalled_seconds", 0))


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:  # pragma: no cover - the [telemetry] extra is missing
        from .errors import JoblaneError

        raise JoblaneError(f"--metrics-port needs prometheus-client: {install_hint('telemetry')}") from None
    return prometheus_client


class RelayMetrics(_Served):
    """The metrics of one outbox relay, in their own registry.

    * ``joblane_outbox_messages_total{topic,outcome}``: rows by recorded outcome (sent, retry, failed, released);
    * ``joblane_outbox_batch_seconds``: how long batches took from delivery to recording;
    * ``joblane_outbox_outcomes_stale_total``: outcomes not recorded because another relay had taken the rows.
    """

    def __init__(self, relay: Any):
        prometheus_client = _prometheus()
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        self.messages = prometheus_client.Counter(
            "joblane_outbox_messages_total", "Outbox rows by recorded outcome.", ["topic", "outcome"],
            registry=self.registry)
        self.batch = prometheus_client.Histogram(
            "joblane_outbox_batch_seconds", "How long outbox batches took, from delivery to recording.",
            registry=self.registry, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
        self.registry.register(_RelayStaleCollector(relay))

    def observe(self, outcomes: Sequence[Any], started_ns: int) -> None:
        """``outcomes`` are the relay's recorded ones (each with ``message.topic`` and ``outcome``)."""
        if not outcomes:
            return
        self.batch.observe((now_ns() - started_ns) / 1e9)
        counts: dict[tuple[str, str], int] = {}
        for o in outcomes:
            k = (o.message.topic, o.outcome)
            counts[k] = counts.get(k, 0) + 1
        for (topic, outcome), n in counts.items():
            self.messages.labels(topic, outcome).inc(n)


class _RelayStaleCollector:
    def __init__(self, relay: Any):
        self.relay = relay

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily("joblane_outbox_outcomes_stale",
                                  "Outbox outcomes not recorded: another relay had taken the rows over.",
                                  value=self.relay.stats.get("stale", 0))


def _serve(metrics: Any, port: int, host: str, logger: str) -> None:
    from prometheus_client import start_http_server

    from .errors import JoblaneError

    try:
        metrics.server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        raise JoblaneError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    metrics.port = metrics.server.server_port
    logging.getLogger(logger).info("metrics at http://%s:%d/metrics", host, metrics.port)


def serve_metrics(worker: Any, port: int, host: str = "127.0.0.1") -> WorkerMetrics:
    """Attach metrics to ``worker`` and serve them at ``http://host:port/metrics`` from a thread."""
    metrics = WorkerMetrics(worker)
    _serve(metrics, port, host, "joblane.worker")
    worker.metrics = metrics
    return metrics


def serve_relay_metrics(relay: Any, port: int, host: str = "127.0.0.1") -> RelayMetrics:
    """Attach metrics to ``relay`` (an outbox ``Relay``) and serve them at ``http://host:port/metrics``."""
    metrics = RelayMetrics(relay)
    _serve(metrics, port, host, "joblane.outbox")
    relay.metrics = metrics
    return metrics
