"""Background services that keep the tables healthy, in one shape (``Service``): validated config,
``run_once()`` returning what it did, a jittered loop. Each runs in every worker (the outbox pruner in
every relay), one at a time cluster-wide (the vacuumer skips a table being vacuumed)."""

from .history import History
from .outbox_pruner import OutboxPruner
from .pruner import Pruner
from .rescuer import Rescuer
from .rotator import Rotator
from .scheduler import Scheduler
from .service import Service
from .vacuumer import Vacuumer

__all__ = ["History", "OutboxPruner", "Pruner", "Rescuer", "Rotator", "Scheduler", "Service", "Vacuumer"]
