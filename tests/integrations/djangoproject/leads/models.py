from django.conf import settings
from django.db import models


class Lead(models.Model):
    email = models.CharField(max_length=200)
    company = models.CharField(max_length=200, blank=True)

    class Meta:
        app_label = "leads"
        # the test schema, quoted the way Django quotes a table name
        db_table = f'{settings.JOBLANE_SCHEMA}"."leads'
