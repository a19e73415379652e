"""OpenTelemetry set-up for the web process and the worker: joblane's spans go wherever yours go."""

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter


def tracer_provider(service: str, exporter: SpanExporter | None = None) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    # in production: OTLPSpanExporter() from opentelemetry-exporter-otlp, to your collector
    provider.add_span_processor(BatchSpanProcessor(exporter or ConsoleSpanExporter()))
    return provider


def setup_tracing(service: str) -> None:
    """Call once at start-up, e.g. in the module that defines the App (the worker imports it too)."""
    trace.set_tracer_provider(tracer_provider(service))
