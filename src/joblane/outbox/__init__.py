"""The transactional outbox: publish in the caller's transaction, relay to a broker, dedupe with the inbox.

``App.publish`` writes a row; ``joblane relay APP`` (``Relay``) delivers the
rows through the sinks routed with ``app.route(prefix, sink)``; ``App.inbox``
lets a Python receiver apply each message once.
"""

from .message import Delivery, Message
from .relay import Relay, RelayResult
from .routes import Route
from .sinks.base import Sink

__all__ = ["Delivery", "Message", "Relay", "RelayResult", "Route", "Sink"]
