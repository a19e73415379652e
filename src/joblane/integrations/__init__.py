"""joblane inside the frameworks people already run: ``django`` (an installable Django app),
``asgi`` (a lifespan for FastAPI/Starlette). SQLAlchemy needs no module: ``App.enqueue`` and
``App.publish`` take a ``Session``/``Connection``, their async twins an ``AsyncSession``/``AsyncConnection``.
"""
