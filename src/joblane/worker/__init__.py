"""The worker: claim (producer), run (executor), record (completer), wake (notifier)."""

from .worker import Worker

__all__ = ["Worker"]
