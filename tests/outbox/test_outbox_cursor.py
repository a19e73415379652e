"""The relay's cursor claim (migration 17), against a real server: the cases that make it hard.

claim_outbox reads each routed topic's entries from a cursor (docs/architecture.md,
"Step 7 as built: the relay's claim"). These tests hold: a held snapshot, an
ordered key whose first row goes to retry, a blocker sent while a claim parks the
row behind it, producers that commit late or roll back, a relay that died with
rows leased, the ring's rotation, and claimers at once.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import joblane
from joblane.queries import quote_ident

from ..helpers import plan_buffers, run_sql


@pytest.fixture
def app(joblane_dsn, joblane_schema):
    return joblane.App(joblane_dsn, schema=joblane_schema)


def publish(conn, app, n: int = 1, topic: str = "t.x", key: str | None = None) -> list[int]:
    """n rows in one INSERT (one transaction on an autocommit connection)."""
    return [r[0] for r in conn.execute(
        f"INSERT INTO {quote_ident(app.schema)}.outbox (topic, key, payload)"
        " SELECT %s, %s, jsonb_build_object('n', i) FROM generate_series(1, %s) AS i RETURNING id",
        (topic, key, n))]


def claim_rows(conn, app, n: int = 100, prefixes=("t.",), ordered=(False,), relay: str = "r",
               lease: float = 30.0) -> tuple[list[tuple], bool]:
    """The rows one claim took (id, attempts), and whether it asks to be called again at once."""
    stmt = app.store.claim_outbox(n, list(prefixes), list(ordered), relay, lease)
    *rows, stop = run_sql(conn, stmt.sql, stmt.args)
    assert stop[0] is None
    return [(r[0], r[6]) for r in rows], bool(stop[6])


def claim(conn, app, n: int = 100, **kw) -> list[int]:
    return [i for i, _ in claim_rows(conn, app, n, **kw)[0]]


def claim_all(conn, app, calls: int = 3, n: int = 1000, **kw) -> list[int]:
    """Claim until ``calls`` calls in a row take nothing (a promotion or a busy lane can leave one empty)."""
    got: list[int] = []
    empty = 0
    while empty < calls:
        ids = claim(conn, app, n, **kw)
        got += ids
        empty = 0 if ids else empty + 1
    return got


def finish(conn, app, rows: list[tuple[int, int]], outcome: str = "sent", relay: str = "r",
           delay: float = 0.0) -> list[int]:
    """Record ``outcome`` for claimed rows (id, attempt) as the relay does; returns the ids it applied to."""
    if not rows:
        return []
    stmt = app.store.finish_outbox([i for i, _ in rows], [outcome] * len(rows), [a for _, a in rows],
                                   [delay] * len(rows), [None] * len(rows), relay)
    return [r[0] for r in run_sql(conn, stmt.sql, stmt.args)]


def states(conn, app, ids) -> dict[int, str]:
    return dict(conn.execute(f"SELECT id, state FROM {quote_ident(app.schema)}.outbox WHERE id = ANY(%s)",
                             (list(ids),)).fetchall())


def claim_buffers(conn, app, n: int = 10) -> int:
    """Shared buffers one claim of ``n`` reads (EXPLAIN (ANALYZE, BUFFERS)), in a rolled-back transaction."""
    stmt = app.store.claim_outbox(n, ["t."], [False], "r", 30.0)
    with conn.transaction(force_rollback=True):
        lines = [r[0] for r in run_sql(conn, "EXPLAIN (ANALYZE, BUFFERS) " + stmt.sql, stmt.args)]
    return plan_buffers(lines)


def finish_buffers(conn, app) -> int:
    """Shared buffers the relay's finish of a batch of 4 reads, planned as the relay plans it (custom plans,
    no nested loops), in a rolled-back transaction."""
    rows, _ = claim_rows(conn, app, 4)
    stmt = app.store.finish_outbox([i for i, _ in rows], ["sent"] * len(rows), [a for _, a in rows],
                                   [0.0] * len(rows), [None] * len(rows), "r")
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        run_sql(conn, app.store.hash_joins_only().sql)
        lines = [r[0] for r in run_sql(conn, "EXPLAIN (ANALYZE, BUFFERS) " + stmt.sql, stmt.args)]
    finish(conn, app, rows)
    return plan_buffers(lines)


def test_pages_read_per_claim_stay_flat_behind_a_held_snapshot(joblane_dsn, app):
    """24,000 messages published, claimed and sent while a session holds a REPEATABLE READ snapshot: every
    version they left stays, and a claim, and the finish of a batch, read as many pages at the end as after
    the first thousand."""
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")  # the snapshot is taken here and kept
        for _ in range(24):
            publish(conn, app, 1000)  # a transaction each
        publish(conn, app, 20)  # the last ones the probes look at
        claim(conn, app, 10)  # the session's first claim reads the catalog and plans
        rows, _ = claim_rows(conn, app, 990)
        finish(conn, app, rows)
        early = min(claim_buffers(conn, app) for _ in range(3))
        early_finish = min(finish_buffers(conn, app) for _ in range(3))
        done = 1000
        while done < 24_000:
            rows, _ = claim_rows(conn, app, 1000)
            assert finish(conn, app, rows) == [i for i, _ in rows]
            done += len(rows)
        conn.execute(f"VACUUM (ANALYZE) {quote_ident(app.schema)}.outbox")  # as autovacuum would: few rows pending
        late = min(claim_buffers(conn, app) for _ in range(3))
        late_finish = min(finish_buffers(conn, app) for _ in range(3))
        holder.rollback()
    assert done == 24_000, done
    # the finish reaches its rows by primary key, not through a partial index of pending rows
    assert late_finish <= early_finish * 1.5 + 20, (early_finish, late_finish)
    # version 16's claim walked every version sent since the snapshot: over 700 pages here at the end
    assert late <= early * 1.5 + 20, (early, late)


def test_an_ordered_key_goes_in_id_order_when_its_first_row_retries(joblane_dsn, app):
    """Five rows of one key on an ordered route, claimed one at a time: the second is parked while the first
    is leased, the first goes to retry and is claimed again when due, and each later row is claimed only after
    the one before it was sent."""
    ordered = {"prefixes": ("t.",), "ordered": (True,)}
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        ids = publish(conn, app, 5, key="k")
        other = publish(conn, app, 1, key="other")
        [(first, a1)] = claim_rows(conn, app, 1, **ordered)[0]
        assert first == ids[0]
        # the rest of the key waits behind the leased first row; another key does not
        assert claim_all(conn, app, n=1, **ordered) == other
        assert finish(conn, app, [(first, a1)], "retry", delay=0.4) == [first]
        assert claim_all(conn, app, n=1, calls=2, **ordered) == [], "nothing before the first row is sent"
        time.sleep(0.5)
        got = claim_rows(conn, app, 1, **ordered)[0] or claim_rows(conn, app, 1, **ordered)[0]
        assert [i for i, _ in got] == [first] and got[0][1] == 2, got
        sent = []
        for expected in ids[1:]:
            assert claim_all(conn, app, n=1, calls=2, **ordered) == [], "the next row waits for this one's sent"
            finish(conn, app, got)
            sent.append(got[0][0])
            got = claim_rows(conn, app, 1, **ordered)[0]
            assert [i for i, _ in got] == [expected], (expected, got)
        finish(conn, app, got)
        assert set(states(conn, app, ids).values()) == {"sent"}


def test_rows_of_a_key_given_back_together_go_again_together_in_order(joblane_dsn, app):
    """A batch takes a key's run; its first row retries and the rest are released: once the first is due,
    one claim takes the whole run again, in id order."""
    ordered = {"prefixes": ("t.",), "ordered": (True,)}
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        ids = publish(conn, app, 4, key="k")
        rows, _ = claim_rows(conn, app, 10, **ordered)
        assert [i for i, _ in rows] == ids
        finish(conn, app, rows[:1], "retry", delay=0.3)
        finish(conn, app, rows[1:], "released")
        assert claim_all(conn, app, calls=2, **ordered) == []
        time.sleep(0.4)
        assert sorted(claim_all(conn, app, **ordered)) == ids


def test_a_blocker_sent_while_a_claim_parks_the_row_behind_it_loses_nothing(joblane_dsn, app):
    """The claim parks a row behind a blocker it holds FOR SHARE; the relay's finish of the blocker waits for
    that claim's commit, then appends the row."""
    ordered = {"prefixes": ("t.",), "ordered": (True,)}
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as claimer, \
            psycopg.connect(joblane_dsn) as finisher:
        a, b, c = publish(conn, app, 3, key="k")
        held = claim_rows(conn, app, 1, **ordered)[0]
        assert [i for i, _ in held] == [a]
        claim_rows(claimer, app, 10, **ordered)  # parks b and c, holding a FOR SHARE until it commits
        assert claimer.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        done = []
        t = threading.Thread(target=lambda: (done.append(finish(finisher, app, held)), finisher.commit()))
        t.start()
        time.sleep(0.3)
        assert not done, "the finish of the blocker waits for the claim that parked the row behind it"
        claimer.commit()
        t.join(10)
        assert done == [[a]]
        got = claim_rows(conn, app, 1, **ordered)[0]
        assert [i for i, _ in got] == [b]
        finish(conn, app, got)
        assert claim_all(conn, app, **ordered) == [c]


def test_a_row_behind_a_blocker_being_sent_right_now_is_appended_again(joblane_dsn, app):
    """The finish of the blocker is under way (its row locked) and its trigger ran before the row behind it
    committed: the claim that meets that row cannot lock the blocker, so it appends the row again rather than
    parking it (parked, nothing would ever append it)."""
    ordered = {"prefixes": ("t.",), "ordered": (True,)}
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as producer, \
            psycopg.connect(joblane_dsn) as finisher:
        [a] = publish(conn, app, 1, key="k")
        held = claim_rows(conn, app, 1, **ordered)[0]
        [b] = publish(producer, app, 1, key="k")  # uncommitted
        assert finish(finisher, app, held) == [a]  # uncommitted: a locked; its trigger could not see b
        producer.commit()
        assert claim_all(conn, app, calls=1, **ordered) == []
        finisher.commit()
        assert claim_all(conn, app, **ordered) == [b]


def test_late_committing_and_aborted_producers(joblane_dsn, app):
    """A producer that began first and commits last: the rows committed meanwhile are claimed at once, its row
    on the claim after its commit; a rolled-back one never."""
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, \
            psycopg.connect(joblane_dsn) as late, psycopg.connect(joblane_dsn) as aborted:
        [slow] = publish(late, app)  # uncommitted
        publish(aborted, app, 2)  # uncommitted, rolled back below
        others: list[int] = []
        for _ in range(5):  # several ranges come and go while both stay open
            others += publish(conn, app, 3)
            taken = claim_all(conn, app, calls=1)
            assert slow not in taken
            for i in taken:
                others.remove(i)
        assert others == []
        aborted.rollback()
        late.commit()
        assert claim_all(conn, app) == [slow]


async def test_rows_leased_by_a_relay_that_died_are_delivered_again(joblane_dsn, app, receiver):
    """A relay claims and dies: its entries are consumed, and no claim finds its rows until requeue_lost_outbox
    gives them new ones; a live relay runs it when idle and delivers them."""
    from joblane.outbox import Relay
    from joblane.outbox.sinks import HttpSink

    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        ids = publish(conn, app, 3)
        assert sorted(claim(conn, app, 10, relay="dead", lease=1.0)) == ids
        time.sleep(1.1)
        assert claim_all(conn, app, calls=2) == [], "their entries were consumed"
        app.route("t.", HttpSink(receiver.url))
        async with Relay(app, listen=False, lease_seconds=5.0) as relay:
            result = await relay.run_once()
        assert sorted(result.ids.get("sent", [])) == ids
        assert sorted(receiver.keys()) == sorted(f"outbox:{i}" for i in ids)
        assert set(states(conn, app, ids).values()) == {"sent"}


def test_requeue_lost_outbox_appends_only_expired_leases(joblane_dsn, app):
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        lost = publish(conn, app, 2)
        assert sorted(claim(conn, app, 10, relay="dead", lease=0.5)) == lost
        live = publish(conn, app, 1)
        assert claim(conn, app, 10, relay="live", lease=60) == live
        time.sleep(0.6)
        n = conn.execute(f"SELECT {quote_ident(app.schema)}.requeue_lost_outbox()").fetchone()[0]
        assert n == 2
        rows = claim_rows(conn, app, 10)[0]
        assert sorted(rows) == [(i, 2) for i in lost]


def test_rotation_empties_slots_under_claims_and_loses_nothing(joblane_dsn, app):
    """The ring turns and empties slots while messages are published, claimed, retried and sent: every
    message is sent, none is claimed while leased."""
    s = quote_ident(app.schema)
    published: list[int] = []
    sent: list[int] = []
    cleared = 0
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn, autocommit=True) as rot:
        for round_ in range(40):
            published += publish(conn, app, 25, key=f"k{round_ % 3}")
            if round_ % 3 == 0:  # some left behind for a later slot
                rows, _ = claim_rows(conn, app, 40, ordered=(True,))
                retried = rows[:2]
                finish(conn, app, retried, "retry")  # due at once: appended again
                sent += finish(conn, app, rows[2:])
            done = rot.execute(f"SELECT {s}.rotate_ready(0)").fetchone()[0]
            cleared += sum(1 for d in done if d.startswith("cleared"))
        for _ in range(200):
            rows, again = claim_rows(conn, app, 1000, ordered=(True,))
            sent += finish(conn, app, rows)
            if not rows and not again and len(sent) == len(published):
                break
        left = conn.execute(f"SELECT count(*) FROM {s}.outbox_entries").fetchone()[0]
    assert sorted(sent) == sorted(published) and len(set(sent)) == len(sent)
    assert cleared >= 3, cleared
    assert left < len(published)  # emptied slots gave their entries back


def test_claimers_at_once_take_every_message_exactly_once(joblane_dsn, app):
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        for i in range(20):
            publish(conn, app, 100, topic=f"t.{i % 2}", key=f"k{i % 5}")
    taken: list[list[int]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with psycopg.connect(joblane_dsn, autocommit=True) as c:
                empty = 0
                while empty < 20:
                    rows, again = claim_rows(c, app, 7, ordered=(i % 2 == 0,), relay=f"r{i}")
                    taken[i] += [r for r, _ in rows]
                    finish(c, app, rows, relay=f"r{i}")
                    empty = 0 if rows or again else empty + 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    everything = [i for ids in taken for i in ids]
    assert len(everything) == 2000 and len(set(everything)) == 2000
    assert sum(1 for ids in taken if ids) >= 2  # not one claimer alone


def test_the_claim_refuses_a_snapshot_older_than_its_statement(joblane_dsn, app):
    with psycopg.connect(joblane_dsn) as conn:
        publish(conn, app)
        conn.commit()
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="READ COMMITTED"):
            claim(conn, app)


def test_the_upgrade_gives_every_pending_row_its_entry(joblane_dsn):
    """Rows published under version 16 (due, not due yet, with a key, leased by a relay of version 16) are
    all claimed after the upgrade; sent and failed ones are not."""
    from joblane import migrations
    from joblane.testing import isolated_schema

    with isolated_schema(joblane_dsn, migrate=False) as schema, psycopg.connect(joblane_dsn, autocommit=True) as conn:
        migrations.migrate(conn, schema, target=16)
        app = joblane.App(joblane_dsn, schema=schema)
        s = quote_ident(schema)
        due = [r[0] for r in conn.execute(
            f"INSERT INTO {s}.outbox (topic, key, payload) SELECT 't.x', CASE WHEN i % 2 = 0 THEN 'k' END, '{{}}'"
            " FROM generate_series(1, 5) AS i RETURNING id")]
        [later] = [r[0] for r in conn.execute(
            f"INSERT INTO {s}.outbox (topic, payload, run_after) VALUES ('t.y', '{{}}', now() + interval '0.5 s')"
            " RETURNING id")]
        [leased] = [r[0] for r in conn.execute(
            f"INSERT INTO {s}.outbox (topic, payload, attempts, relay, lease_until)"
            " VALUES ('t.x', '{}', 1, 'old', now() + interval '0.3 s') RETURNING id")]
        conn.execute(f"INSERT INTO {s}.outbox (topic, payload, state) VALUES ('t.x', '{{}}', 'sent'), ('t.x', '{{}}', 'failed')")
        assert migrations.migrate(conn, schema) == [17]
        ordered = {"prefixes": ("t.",), "ordered": (True,)}
        assert sorted(claim_all(conn, app, calls=2, **ordered)) == due
        time.sleep(0.6)
        conn.execute(f"SELECT {s}.requeue_lost_outbox()")
        assert sorted(claim_all(conn, app, **ordered)) == [later, leased]


def test_promoted_rows_leave_outbox_deferred_and_the_rest_stay(joblane_dsn, app):
    """prune_deferred takes away the outbox_deferred rows the relay's promotion took, not a row due later
    nor one whose transaction was still open when the promotion last looked."""
    s = quote_ident(app.schema)
    prune = f"SELECT {s}.prune_deferred(%s)"
    later_sql = (f"INSERT INTO {s}.outbox (topic, payload, run_after)"
                 " SELECT 't.x', '{}', now() + make_interval(secs => %s) FROM generate_series(1, %s) RETURNING id")
    waiting = f"SELECT outbox_id FROM {s}.outbox_deferred ORDER BY outbox_id"
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as producer:
        soon = [r[0] for r in conn.execute(later_sql, (0.3, 3))]
        [later] = [r[0] for r in conn.execute(later_sql, (3600, 1))]
        [tardy] = [r[0] for r in producer.execute(later_sql, (0.3, 1))]
        time.sleep(0.5)
        assert sorted(claim_all(conn, app)) == soon  # the promotion's snapshot had tardy's transaction open
        producer.commit()
        assert conn.execute(prune, (1000,)).fetchone()[0] == 3
        assert [r[0] for r in conn.execute(waiting)] == [later, tardy]
        assert claim_all(conn, app) == [tardy]
        assert conn.execute(prune, (1000,)).fetchone()[0] == 1
        assert [r[0] for r in conn.execute(waiting)] == [later]


def test_the_finish_and_the_heartbeat_of_a_batch_cannot_walk_the_index_of_pending_rows(joblane_dsn, app):
    """Behind a held snapshot, outbox_ready holds an entry for every version of every row sent since: the
    relay's finish and lease heartbeat must reach their rows by primary key. With the primary key out of the
    planner's reach (marked invalid in a rolled-back transaction), neither may fall back on outbox_ready."""
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        publish(conn, app, 20)
        rows, _ = claim_rows(conn, app, 4)
        ids, attempts = [i for i, _ in rows], [a for _, a in rows]
        plans = []
        for stmt in (app.store.finish_outbox(ids, ["sent"] * 4, attempts, [0.0] * 4, [None] * 4, "r"),
                     app.store.extend_outbox_leases(ids, "r", 30.0)):
            with conn.transaction(force_rollback=True):
                conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
                             (f"{quote_ident(app.schema)}.outbox_pkey",))
                conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                run_sql(conn, app.store.hash_joins_only().sql)
                plans.append("\n".join(r[0] for r in run_sql(conn, "EXPLAIN " + stmt.sql, stmt.args)))
        assert not [p for p in plans if "outbox_ready" in p], plans
        assert finish(conn, app, rows) == ids
