"""Transition shim: the outbox's admin operations live in ``joblane.admin``."""

from ..admin import OUTBOX_STATES  # noqa: F401
from ..admin import outbox_counts as counts  # noqa: F401
from ..admin import outbox_message as get_message  # noqa: F401
from ..admin import outbox_messages as list_messages  # noqa: F401
from ..admin import retry_outbox as retry  # noqa: F401
