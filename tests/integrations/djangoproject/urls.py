from django.urls import path

from . import views

urlpatterns = [path("leads/", views.create_lead)]
