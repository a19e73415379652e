"""Found by the joblane app's autodiscovery of `tasks` modules."""

from joblane.integrations.django import app

from .models import Lead


@app.task("enrich_lead", queue="leads")
def enrich_lead(job):
    # a plain function runs in a worker thread, with its own Django connection
    Lead.objects.filter(id=job.payload["lead_id"]).update(company="Acme")
