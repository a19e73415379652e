"""Delivering ``crm.*`` messages to the CRM: joblane's HTTP sink, with read-back.

The CRM creates a contact on every POST and has no idempotency key, so a
message sent twice would make two contacts. Before any re-send (a try after
a crash, a timeout or an error answer) the relay asks ``find``: a search by
email that looks for a contact carrying this message's idempotency key as
its ``external_id``. Found: the row is marked sent without a second POST.
"""

from __future__ import annotations

from joblane.outbox import Message
from joblane.outbox.sinks import HttpSink


class CrmSink(HttpSink):
    name = "crm"

    def __init__(self, base_url: str, **options):
        self.base_url = base_url.rstrip("/")
        super().__init__(f"{self.base_url}/contacts", find=self.contact_exists, timeout=10.0, **options)

    async def contact_exists(self, message: Message) -> bool:
        session = await self.session()
        # raise_for_status: an error here keeps the row waiting, never re-send blind
        async with session.get(f"{self.base_url}/contacts", params={"email": message.payload["email"]},
                               raise_for_status=True) as response:
            found = (await response.json())["contacts"]
        return any(c.get("external_id") == message.idempotency_key for c in found)

    def __repr__(self) -> str:
        return f"<CrmSink {self.base_url}>"


def contact_payload(lead: dict, enrichment: dict, classification: dict, external_id: str) -> dict:
    """What the CRM stores for a qualified lead; ``external_id`` is the message's idempotency key."""
    return {
        "external_id": external_id,
        "email": lead["email"],
        "name": lead["name"],
        "company": enrichment.get("company") or lead["company"],
        "domain": enrichment["domain"],
        "industry": enrichment["industry"],
        "size_band": enrichment["size_band"],
        "intent": classification.get("intent"),
        "fit": classification.get("fit"),
        "confidence": classification.get("confidence"),
        "source": "web form",
    }
