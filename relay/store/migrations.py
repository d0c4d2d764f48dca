"""The SQLite schema, as numbered migrations recorded in the database.

Each migration and the row that records it commit in one transaction, so a
crash mid-upgrade leaves the database at the old version, never between two.
Indexes on deliveries are partial: a finished delivery leaves the due index,
so finding the next due rows costs the same with a million delivered rows.
"""

from __future__ import annotations

import sqlite3
import time

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "events, deliveries, attempts",
        [
            """
            CREATE TABLE events (
                id INTEGER PRIMARY KEY,
                route TEXT NOT NULL,
                idempotency_key TEXT,
                received_at REAL NOT NULL,
                remote_addr TEXT,
                method TEXT NOT NULL,
                path TEXT NOT NULL,
                query TEXT NOT NULL,
                headers BLOB NOT NULL,
                content_type TEXT,
                body BLOB NOT NULL
            )
            """,
            # Key first: the same index answers "search by idempotency key".
            """
            CREATE UNIQUE INDEX events_key ON events (idempotency_key, route)
            WHERE idempotency_key IS NOT NULL
            """,
            "CREATE INDEX events_received ON events (received_at)",
            """
            CREATE TABLE deliveries (
                id INTEGER PRIMARY KEY,
                event_id INTEGER NOT NULL,
                route TEXT NOT NULL,
                target TEXT NOT NULL,
                status TEXT NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                cycle_attempts INTEGER NOT NULL DEFAULT 0,
                next_attempt_at REAL,
                lease_until REAL,
                last_error TEXT,
                updated_at REAL NOT NULL,
                resume_status TEXT,
                resume_at REAL
            )
            """,
            "CREATE INDEX deliveries_event ON deliveries (event_id)",
            """
            CREATE INDEX deliveries_due ON deliveries (target, next_attempt_at)
            WHERE status = 'pending'
            """,
            """
            CREATE INDEX deliveries_leased ON deliveries (target, lease_until)
            WHERE status = 'in_flight'
            """,
            "CREATE INDEX deliveries_dead ON deliveries (event_id) WHERE status = 'dead'",
            """
            CREATE TABLE attempts (
                id INTEGER PRIMARY KEY,
                delivery_id INTEGER NOT NULL,
                number INTEGER NOT NULL,
                started_at REAL NOT NULL,
                duration REAL NOT NULL,
                outcome TEXT NOT NULL,
                http_status INTEGER,
                error TEXT,
                response BLOB,
                next_attempt_at REAL
            )
            """,
            "CREATE INDEX attempts_delivery ON attempts (delivery_id)",
        ],
    ),
    (
        2,
        "target state (pause, health), delivery log, dead index by target",
        [
            """
            CREATE TABLE targets (
                name TEXT PRIMARY KEY,
                paused INTEGER NOT NULL DEFAULT 0,
                paused_at REAL,
                last_success_at REAL,
                last_error_at REAL,
                last_error TEXT,
                consecutive_failures INTEGER NOT NULL DEFAULT 0
            )
            """,
            # What people did to a delivery (retry now, requeue), beside its attempts.
            """
            CREATE TABLE delivery_log (
                id INTEGER PRIMARY KEY,
                delivery_id INTEGER NOT NULL,
                at REAL NOT NULL,
                kind TEXT NOT NULL,
                detail TEXT
            )
            """,
            "CREATE INDEX delivery_log_delivery ON delivery_log (delivery_id)",
            # One row, rewritten by the readiness check to prove the store takes writes.
            "CREATE TABLE heartbeat (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL)",
            "DROP INDEX deliveries_dead",
            "CREATE INDEX deliveries_dead ON deliveries (target, event_id) WHERE status = 'dead'",
        ],
    ),
    (
        3,
        "rejections: what relay refused, the last 100 per route",
        [
            """
            CREATE TABLE rejections (
                id INTEGER PRIMARY KEY,
                route TEXT NOT NULL,
                at REAL NOT NULL,
                remote_addr TEXT,
                reason TEXT NOT NULL,
                detail TEXT,
                headers BLOB NOT NULL
            )
            """,
            "CREATE INDEX rejections_route ON rejections (route, id)",
        ],
    ),
    (
        4,
        "attempts by time, for the dashboard's last 24 hours",
        ["CREATE INDEX attempts_started ON attempts (started_at)"],
    ),
    (
        5,
        "the highest event and delivery ids ever given, so a purge never lets one be given again",
        [
            # Receivers de-duplicate on X-Relay-Event-Id (and on the event id as
            # Idempotency-Key when the sender gave none): an id must name one
            # event forever, even after the newest ones are purged.
            """
            CREATE TABLE id_high_water (name TEXT PRIMARY KEY, last_id INTEGER NOT NULL)
            WITHOUT ROWID
            """,
            *(
                f"""
                CREATE TRIGGER {table}_high_water AFTER DELETE ON {table} BEGIN
                    INSERT INTO id_high_water (name, last_id) VALUES ('{table}', old.id)
                    ON CONFLICT (name) DO UPDATE SET last_id = max(last_id, excluded.last_id);
                END
                """
                for table in ("events", "deliveries")
            ),
        ],
    ),
    (
        6,
        "key conflicts: a payload digest per event; one key may name several different payloads",
        [
            # A key that arrives again with other content is a new event, not
            # a duplicate: it is stored with the next variant of its key and
            # points at the event that held the key first.
            "ALTER TABLE events ADD COLUMN digest BLOB",
            "ALTER TABLE events ADD COLUMN key_variant INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE events ADD COLUMN conflict_of INTEGER",
            "DROP INDEX events_key",
            # Key first still: the same index answers "search by idempotency key".
            """
            CREATE UNIQUE INDEX events_key ON events (idempotency_key, route, key_variant)
            WHERE idempotency_key IS NOT NULL
            """,
        ],
    ),
    (
        7,
        "target down state (hold_when_down): kept so a restart neither forgets nor re-learns it",
        [
            # Failures in a row that say "the target is down" (network, 5xx, 429).
            "ALTER TABLE targets ADD COLUMN down_streak INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE targets ADD COLUMN down_since REAL",
            "ALTER TABLE targets ADD COLUMN probe_at REAL",
            "ALTER TABLE targets ADD COLUMN probes INTEGER NOT NULL DEFAULT 0",
        ],
    ),
    # The search index (relay/search.py makes its text). FTS5's trigram tokenizer
    # matches any substring of three characters or more; `detail=full` keeps token
    # positions, so a phrase is checked by the index itself (a rare phrase of common
    # trigrams stays fast at a million events); `columnsize=0` drops per-row sizes,
    # which only ranking uses. The index is filled off the ingest path: rows up to
    # `search_progress.indexed_through` are in it, the rest wait for the indexer.
    (
        8,
        "search index by content (FTS5 trigram), its progress, purge removes from it",
        [
            """
            CREATE VIRTUAL TABLE event_search USING fts5(
                text, digits, tokenize = 'trigram', detail = full, columnsize = 0
            )
            """,
            """
            CREATE TABLE search_progress (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                indexed_through INTEGER NOT NULL
            )
            """,
            "INSERT INTO search_progress (id, indexed_through) VALUES (1, 0)",
            """
            CREATE TRIGGER events_search_purge AFTER DELETE ON events BEGIN
                DELETE FROM event_search WHERE rowid = old.id;
            END
            """,
        ],
    ),
    (
        9,
        "corrected copies: which event was resent as which, by whom, when",
        [
            # An edited copy of an event is a new event; this row links the two
            # both ways (the original is never changed) and says who sent it.
            """
            CREATE TABLE resends (
                copy_id INTEGER PRIMARY KEY,
                original_id INTEGER NOT NULL,
                at REAL NOT NULL,
                by TEXT NOT NULL
            )
            """,
            "CREATE INDEX resends_original ON resends (original_id)",
        ],
    ),
    (
        10,
        "per-key ordering (order_by): each delivery's key, and the unfinished ones by key",
        [
            "ALTER TABLE deliveries ADD COLUMN order_key TEXT",
            # The line of each key: unfinished deliveries in order of receipt.
            # Its first is the only one that may be attempted; the others wait
            # pending with next_attempt_at NULL, so they are outside the due
            # range and a claim never reads them, however many there are.
            """
            CREATE INDEX deliveries_order ON deliveries (target, order_key, id)
            WHERE order_key IS NOT NULL AND status IN ('pending', 'in_flight', 'dead')
            """,
        ],
    ),
    (
        11,
        "each delivery's random tag: its webhook-id is unique across databases",
        # NULL for deliveries stored before: they keep the webhook-id their
        # earlier attempts carried (msg_relay_<id>).
        ["ALTER TABLE deliveries ADD COLUMN message_tag TEXT"],
    ),
    (
        12,
        "the operator's loop: payloads that fail alone, probes, attempts by kind",
        [
            # Successes of a target, counted: a delivery that fails again after
            # the target delivered others since its last failure fails alone
            # (its payload, not the target), and never makes the target down.
            "ALTER TABLE targets ADD COLUMN successes INTEGER NOT NULL DEFAULT 0",
            # The delivery of the last probe of a down target (or the failure that made it down).
            "ALTER TABLE targets ADD COLUMN probe_delivery INTEGER",
            "ALTER TABLE deliveries ADD COLUMN seen_successes INTEGER",
            "ALTER TABLE deliveries ADD COLUMN fails_alone INTEGER NOT NULL DEFAULT 0",
            # 'cycle' (a step of the retry cycle), 'manual' (a person's retry
            # now) or 'probe' (of a down target); and the step's number in its cycle.
            "ALTER TABLE attempts ADD COLUMN kind TEXT NOT NULL DEFAULT 'cycle'",
            "ALTER TABLE attempts ADD COLUMN cycle_number INTEGER",
            # A corrected copy's delivery and the original's to the same target:
            # delivered, the copy resolves the original (if dead), both linked.
            "ALTER TABLE deliveries ADD COLUMN resolves INTEGER",
            "ALTER TABLE deliveries ADD COLUMN resolved_by INTEGER",
            # Who did what: every operator action (pause, resume, retry, skip,
            # requeue, resend), with the deliveries it touched (the first
            # AUDIT_IDS_KEPT); each delivery's history line names who too.
            """
            CREATE TABLE audit (
                id INTEGER PRIMARY KEY,
                at REAL NOT NULL,
                by TEXT NOT NULL,
                action TEXT NOT NULL,
                subject TEXT NOT NULL,
                count INTEGER NOT NULL,
                deliveries TEXT NOT NULL
            )
            """,
            "ALTER TABLE delivery_log ADD COLUMN by TEXT",
            # The request an attempt sent (method, URL, headers as JSON, secrets
            # masked) and its body's first bytes, shown beside the answer.
            "ALTER TABLE attempts ADD COLUMN request TEXT",
            "ALTER TABLE attempts ADD COLUMN request_body BLOB",
        ],
    ),
    (
        13,
        "each delivery's own identity: the Idempotency-Key no other delivery is sent with",
        [
            # Deliveries stored before are marked (the default, no row
            # rewritten): an attempted one keeps the key its attempts carried,
            # its event's, which a receiver may remember (relay.core.identity).
            "ALTER TABLE deliveries ADD COLUMN event_keyed INTEGER NOT NULL DEFAULT 1",
            # One waiting for its first attempt takes its own identity now: no
            # receiver has seen it (one in flight may have been sent when relay
            # stopped: its attempt is counted at the next start). Without a tag
            # (stored before tags) it is given one.
            """
            UPDATE deliveries SET event_keyed = 0,
                message_tag = COALESCE(message_tag, lower(hex(randomblob(8))))
            WHERE status = 'pending' AND attempts = 0
            """,
        ],
    ),
    (
        14,
        "receivers' throttles: a target held until a moment, and the episode's count",
        [
            # A 429 (or a status the target declares temporary) holds the whole
            # target: nothing of it is claimed before throttled_until; throttles
            # counts the answers that grew the hold (relay.delivery.step, rule 4).
            "ALTER TABLE targets ADD COLUMN throttled_until REAL",
            "ALTER TABLE targets ADD COLUMN throttles INTEGER NOT NULL DEFAULT 0",
        ],
    ),
    (
        15,
        "a route's failed attempts in a row at each target, kept across restarts",
        [
            # What the alerts "failing" and "recovered" count (relay.store.streaks):
            # kept here, a streak that began before a restart ends after it.
            """
            CREATE TABLE route_streaks (
                route TEXT NOT NULL,
                target TEXT NOT NULL,
                failures INTEGER NOT NULL,
                last_error TEXT,
                updated_at REAL NOT NULL,
                PRIMARY KEY (route, target)
            )
            """
        ],
    ),
    (
        16,
        "the operator's attention: fresh evidence, deliveries that keep failing, silent routes",
        [
            # hold_when_down: when the target was last probed (or went down),
            # and the number of the probe its backoff schedules next. A
            # delivery that arrived since is the next probe (relay.delivery.step).
            "ALTER TABLE targets ADD COLUMN probed_at REAL",
            "ALTER TABLE targets ADD COLUMN probe_step INTEGER NOT NULL DEFAULT 0",
            # A target down now: its backoff goes on where it was; what
            # arrived while it was down is fresh evidence.
            """
            UPDATE targets SET probed_at = down_since, probe_step = probes + 1
            WHERE down_since IS NOT NULL
            """,
            # Deliveries that keep failing (relay.store.reads.KEEPS_FAILING):
            # only those that failed in their cycle, never a new one (ingest
            # writes nothing more to it).
            """
            CREATE INDEX deliveries_failing ON deliveries (cycle_attempts)
            WHERE status IN ('pending', 'in_flight') AND cycle_attempts > 0
            """,
            # The silence watch (relay.background.silence), learnt from the
            # events as stored, never written on their way in: each route's
            # first and last event and whether it is silent; its longest
            # silence in each hour of the week (0-167, the operator's zone)
            # of each week (days since a Monday, by 7); the events learnt.
            """
            CREATE TABLE route_watch (
                route TEXT PRIMARY KEY,
                first_event_at REAL NOT NULL,
                last_event_at REAL NOT NULL,
                silent_since REAL,
                silent_usual REAL,
                silent_limit REAL
            )
            """,
            """
            CREATE TABLE route_rhythm (
                slot INTEGER NOT NULL,
                route TEXT NOT NULL,
                week INTEGER NOT NULL,
                longest REAL NOT NULL,
                PRIMARY KEY (slot, route, week)
            )
            """,
            """
            CREATE TABLE rhythm_progress (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                learnt_through INTEGER NOT NULL
            )
            """,
            "INSERT INTO rhythm_progress (id, learnt_through) VALUES (1, 0)",
        ],
    ),
    (
        17,
        "a stored event cannot stop relay: what the search indexer is on, events it skipped",
        [
            # The last event of the batch the indexer is on, written before
            # it begins (NULL: on none): after a crash it knows what it was
            # reading (relay.background.indexer).
            "ALTER TABLE search_progress ADD COLUMN working_through INTEGER",
            # Why a background pass skipped this event (NULL: it did not).
            "ALTER TABLE events ADD COLUMN flagged TEXT",
            "CREATE INDEX events_flagged ON events (id) WHERE flagged IS NOT NULL",
        ],
    ),
]

LATEST = MIGRATIONS[-1][0]


def migrate(connection: sqlite3.Connection) -> int:
    """Bring the database to the latest version; returns the version it was at."""
    connection.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    start = current_version(connection)
    # Every migration not recorded is applied, in order: one numbered below
    # the newest recorded (two made side by side, applied in the other
    # order) is not passed over.
    applied = applied_versions(connection)
    for version, description, statements in MIGRATIONS:
        if version in applied:
            continue
        connection.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have applied it while we waited for the lock.
            if version in applied_versions(connection):
                connection.execute("ROLLBACK")
                continue
            for statement in statements:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
                (version, description, time.time()),
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
    return start


def applied_versions(connection: sqlite3.Connection) -> set[int]:
    return {row[0] for row in connection.execute("SELECT version FROM schema_migrations")}


def current_version(connection: sqlite3.Connection) -> int:
    row = connection.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return int(row[0] or 0)
