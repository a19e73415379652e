"""SQLAlchemy 2.x: the session's transaction carries the job, sync or async."""

from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import joblane

jobs = joblane.App()  # DATABASE_URL, JOBLANE_SCHEMA


class Base(DeclarativeBase):
    pass


class Lead(Base):
    __tablename__ = "leads"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


def create_lead(session: Session, email: str) -> int:
    lead = Lead(email=email)
    session.add(lead)
    session.flush()  # the INSERT runs now, so lead.id is known
    jobs.enqueue(session, "enrich_lead", {"lead_id": lead.id})  # same connection, same transaction
    return lead.id


async def create_lead_async(session: AsyncSession, email: str) -> int:
    lead = Lead(email=email)
    session.add(lead)
    await session.flush()
    await jobs.enqueue_async(session, "enrich_lead", {"lead_id": lead.id})
    return lead.id


# In a request handler:
#
#     with Session(engine) as session, session.begin():   # commit: lead and job; an exception: neither
#         create_lead(session, "a@acme.test")
