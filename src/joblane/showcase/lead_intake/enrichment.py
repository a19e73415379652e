"""Enrich a lead from the bundled company data: deterministic, no network."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data")


class NotALead(Exception):
    """The submission cannot become a lead, whatever we retry (a disposable address, say)."""


@lru_cache(maxsize=1)
def reference() -> dict[str, Any]:
    with open(DATA / "companies.json", encoding="utf-8") as f:
        data = json.load(f)
    data["by_domain"] = {c["domain"]: c for c in data["companies"]}
    return data


def size_band(employees: int | None) -> str:
    if employees is None:
        return "unknown"
    for limit, band in ((10, "1-9"), (50, "10-49"), (200, "50-199"), (1000, "200-999")):
        if employees < limit:
            return band
    return "1000+"


def enrich(email: str, company: str) -> dict[str, Any]:
    """Company domain, industry, size band and country for the lead's address."""
    ref = reference()
    domain = email.rsplit("@", 1)[-1].lower()
    if domain in ref["disposable_email_domains"]:
        raise NotALead(f"disposable email domain {domain}")
    personal = domain in ref["free_email_domains"]
    known = ref["by_domain"].get(domain)
    employees = known["employees"] if known else None
    return {
        "domain": domain,
        "personal_email": personal,
        "company": known["name"] if known else (company or None),
        "known_company": known is not None,
        "industry": known["industry"] if known else None,
        "employees": employees,
        "size_band": size_band(employees),
        "country": known["country"] if known else None,
        "target_industry": bool(known and known["industry"] in ref["target_industries"]),
    }
