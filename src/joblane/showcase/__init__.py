"""The showcase: `joblane demo` (the lead-intake example end to end) and `joblane bench`.

Not part of the library: only the command line imports it. ``lead_intake``
is the worked example the demo runs, shipped in the wheel with its
templates and sample data; ``demo.sql`` holds the demo's own named queries.
"""

from __future__ import annotations

import socket

DEFAULT_SCHEMA = "lead_intake"  # the demo's own schema, dropped and made again by every run


def free_port(preferred: int = 0) -> int:
    """``preferred`` when nothing listens there on 127.0.0.1, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")
