"""The lead-intake workflow, joblane's worked example (``make demo`` runs it end to end).

A web form takes a lead; the handler inserts it and its ``enrich`` job in one
transaction. Workers then enrich it from bundled company data, classify it
with a chat-completions model, and deliver it: a qualified lead is written
back and published as ``crm.lead_qualified`` in one transaction, and the
relay creates the contact in the CRM, reading back before any re-send
because the CRM cannot deduplicate.

Modules: ``app`` (the App, its tasks and its outbox route), ``form`` (the
Starlette form), ``db`` (the ``leads`` table), ``enrichment``, ``model``
(the chat-completions client), ``crm`` (the CRM sink with read-back),
``settings``; ``local_model`` and ``local_crm`` are the stand-ins for the
model provider and the CRM that the demo starts on loopback ports.
"""
