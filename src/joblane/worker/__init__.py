"""The worker: claim (producer), run (executor), record (completer), within limits (limiter).

``worker.Worker`` wires them together with heartbeats, the maintenance
services and the notifier (``joblane.notifier``, shared with the relay).
"""

from .worker import Worker

__all__ = ["Worker"]
