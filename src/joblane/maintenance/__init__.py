"""Background services that keep the tables healthy; each runs in every worker, one at a time cluster-wide."""

from .service import Service
from .rescuer import Rescuer
from .pruner import Pruner

__all__ = ["Pruner", "Rescuer", "Service"]
