"""A minimal Django project on the test database; joblane's tables and the app's live in one fresh schema."""

import os
from urllib.parse import unquote, urlsplit

from joblane.testing import database_url, new_schema_name

# chosen once per test run and inherited by the worker processes the tests start
SCHEMA = os.environ.setdefault("JOBLANE_TEST_DJANGO_SCHEMA", new_schema_name("dj"))

_url = urlsplit(database_url())
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": _url.port or "",
    }
}
INSTALLED_APPS = [
    "joblane.integrations.django",
    "tests.integrations.djangoproject.leads",
]
JOBLANE_SCHEMA = SCHEMA
ROOT_URLCONF = "tests.integrations.djangoproject.urls"
SECRET_KEY = "tests-only"
ALLOWED_HOSTS = ["*"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
