import pytest

import signups

pytest_plugins = ["joblane.testing"]  # the fixtures joblane_dsn and joblane_schema


@pytest.fixture
def app(joblane_schema):
    from joblane.testing import app_on_schema

    # a fresh migrated schema per test, dropped afterwards; the project's App points at it meanwhile
    with app_on_schema(signups.app, joblane_schema) as app:
        yield app
