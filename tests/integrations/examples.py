"""Load the docs' example files as modules: the docs show them, the tests run them."""

from __future__ import annotations

import importlib.util
import uuid
from types import ModuleType

from ..conftest import ROOT


def load_example(path: str) -> ModuleType:
    """Import ``docs/examples/<path>`` afresh (a new module each time, so tests do not share its App)."""
    file = ROOT / "docs" / "examples" / path
    spec = importlib.util.spec_from_file_location(f"docs_example_{uuid.uuid4().hex[:8]}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
