"""Where the example's services are, read from the environment when a module first asks.

``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``LEAD_INTAKE_MODEL`` point the
classify step at any OpenAI-compatible provider (the demo sets them to its
local model server unless ``OPENAI_BASE_URL`` is already set);
``LEAD_INTAKE_CRM_URL`` is the CRM's base URL; ``LEAD_INTAKE_MIN_CONFIDENCE``
is the confidence below which a person reviews the lead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    model_url: str  # base URL of an OpenAI-compatible API, ending in /v1
    api_key: str
    model: str
    crm_url: str
    min_confidence: float  # below this a person reviews the lead
    prompt_version: str


def load() -> Settings:
    return Settings(
        model_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8701/v1").rstrip("/"),
        api_key=os.environ.get("OPENAI_API_KEY", "local"),
        model=os.environ.get("LEAD_INTAKE_MODEL", "gpt-4o-mini"),
        crm_url=os.environ.get("LEAD_INTAKE_CRM_URL", "http://127.0.0.1:8702").rstrip("/"),
        min_confidence=float(os.environ.get("LEAD_INTAKE_MIN_CONFIDENCE", "0.6")),
        prompt_version=os.environ.get("LEAD_INTAKE_PROMPT_VERSION", "qualify-v2"),
    )
