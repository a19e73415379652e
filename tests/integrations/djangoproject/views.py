from django.db import transaction
from django.http import JsonResponse

from joblane.integrations.django import enqueue, publish

from .leads.models import Lead


def create_lead(request):
    with transaction.atomic():
        lead = Lead.objects.create(email=request.POST["email"])
        job_id = enqueue("enrich_lead", {"lead_id": lead.id})
        publish("crm.lead_created", {"lead_id": lead.id}, key=f"lead-{lead.id}")
        if request.POST.get("fail"):
            raise RuntimeError("the view failed after enqueueing")
    return JsonResponse({"lead": lead.id, "job": job_id}, status=201)
