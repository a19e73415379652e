"""Transition shim: the review operations live in ``joblane.admin``; durations and times in ``joblane.rules``."""

from .admin import OUTCOMES, parse_sets  # noqa: F401
from .rules import duration_or_none as parse_seconds  # noqa: F401
from .rules import parse_when  # noqa: F401
