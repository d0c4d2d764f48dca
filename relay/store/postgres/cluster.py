"""What N relay instances on one PostgreSQL database share besides the queue.

- Limits: a target's `concurrency` and `rate` (and a rate group's) are totals
  across instances. Each claim locks the pacing rows of the targets it claims
  for (in one order, so two instances never wait on each other in a cycle),
  counts the target's live leases, and moves the next allowed moment forward.
- Down targets (hold_when_down): the claim decides, under the target's
  claim lock, from the `targets` row every instance writes: a down target's
  deliveries are claimed only as its one probe, when its probe time has come
  and no attempt of it is under way anywhere (`allowed`). An instance's own
  memory of the down state may be a poll old; the database's is the rule.
- Liveness: each instance's row in `instances` is touched every fifth of
  dead_after (`[storage] dead_after`, DEAD_AFTER by default) by the server's
  clock; leases of an instance not seen for dead_after (or stopped) are
  claimable before they expire (kill -9 costs seconds, not the lease's
  length). The server's clock, not the injected one: this is about processes
  being alive, which every instance must judge alike; so is the end of a
  live instance's lease (`lapsed`). A silence is a sign of death only to an
  instance that was itself there to see it: one back from a silence of its
  own (the database restarted, or out of reach for all) judges nobody gone
  until it has been back for dead_after, and a claim marks its instance
  alive in its own transaction when the heartbeats have not, so whoever
  sees its leases sees it alive.
- Leadership: retention, alert grouping, the queue gauges and the search
  index run on the instance holding a session advisory lock; when that
  instance dies its session ends and another takes the lock. A hung one's
  session is ended by the server after dead_after of silence
  (idle_session_timeout).
- Wake-ups: LISTEN on one channel; a broken connection is made again, and
  polling covers the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import asyncpg

from relay.config import Config
from relay.store.base import DownState, StoreError
from relay.store.columns import TARGET_STATE
from relay.store.postgres.errors import DRIVER_ERRORS, POOLER, Connection

log = logging.getLogger("relay.store")

DEAD_AFTER = 10.0
# Connections an instance opens besides its pool's ([storage] pool_size):
# its heartbeats, its lead (which holds its name), its wake-ups (LISTEN).
CONNECTIONS_BESIDES_POOL = 3
SESSION_POOLING_NEEDED = "two of relay's connections reach one server session: " + POOLER
LEADER_LOCK = 0x72656C6179_02
# With hashtext(instance id): held by the running instance of that name (the
# two-key form: apart from the one-key locks above).
NAME_LOCK = 0x72656C61
# Cluster pacing runs 10 % slower than the limit: an instance claims, then
# sends some milliseconds later (a template rendered in a thread, a
# connection opened), and two instances' delays differ. N sends spaced by
# 1.1/rate span 1.1 s of claims, so a receiver counting any window of
# `per` seconds stays within its limit while those delays differ by up to
# 10 % of the window (100 ms for "5/s"): a smaller margin let three
# instances on a loaded machine through.
CLUSTER_PACE_MARGIN = 1.1
SERVER_NOW = "extract(epoch from clock_timestamp())"


def lapsed(me: str, now: str, dead_after: str, unanswered: tuple[str, str] | None = None) -> str:
    """SQL: the lease of the `deliveries` row at hand may be taken (or given
    back) by instance `me`, whose clock says `now` (placeholders).

    Its own lease, by its own clock, or at once when it was written by one of
    its claims whose answer never came (`unanswered`: a bigint[] of the
    deliveries those claims leased and a float8[] of each one's claim's
    `now`, which it wrote into `updated_at`): the claim committed, the
    connection broke before its answer, and no attempt of it is under way
    here. Another instance's, if that instance is
    gone (unseen for `dead_after`, or stopped); if it is alive, once the lease
    has run out by the server's clock: a lease is written by its owner's clock
    and compared by the claimer's, so a claimer whose clock is minutes fast
    would otherwise take every lease of the cluster while it is being sent.
    (A lease written before the server's end was kept: by the caller's clock.)
    """
    own = f"deliveries.lease_until <= {now}"
    if unanswered is not None:
        ids, moments = unanswered
        own = (
            f"({own} OR (deliveries.id, deliveries.updated_at) IN"
            f" (SELECT * FROM unnest({ids}, {moments})))"
        )
    # The owner's silence, if it is one the claimer shared (back from its own
    # less than dead_after ago), says nothing: the owner counts as alive.
    # Stopped is stopped (alive_at NULL), whatever the claimer saw.
    shared = (
        f"(i.alive_at IS NOT NULL AND EXISTS (SELECT 1 FROM instances m WHERE m.id = {me}"
        f" AND m.back_at > {SERVER_NOW} - {dead_after}))"
    )
    return (
        f"(CASE WHEN deliveries.lease_owner = {me} THEN {own}"
        " WHEN EXISTS (SELECT 1 FROM instances i WHERE i.id = deliveries.lease_owner"
        f" AND (i.alive_at >= {SERVER_NOW} - {dead_after} OR {shared}))"
        f" THEN coalesce(deliveries.lease_expires <= {SERVER_NOW}, deliveries.lease_until <= {now})"
        " ELSE true END)"
    )


# A lease's end by the server's clock, for a claim whose lease runs from $now to $until.
def lease_expires(now: str, until: str) -> str:
    return f"{SERVER_NOW} + ({until} - {now})"


@dataclass(frozen=True)
class TargetLimits:
    concurrency: int
    # (pacing row, seconds between two sends): the target's own rate, its groups'.
    paces: tuple[tuple[str, float], ...] = ()
    # While down, one probe at a time for the whole cluster (`allowed`).
    hold_when_down: bool = False
    # The pacing rows a receiver's wait holds besides the target (its rate
    # groups'; Telegram's chat, not its bot: TargetConfig.held_by_a_wait).
    held_paces: tuple[str, ...] = ()


def cluster_limits(config: Config) -> dict[str, TargetLimits]:
    """Each target's limits as every instance must share them."""
    limits = {}
    for name, target in config.targets.items():
        paces = []
        held = []
        if target.rate is not None:
            paces.append((f"target:{name}", CLUSTER_PACE_MARGIN / target.rate.per_second))
        for group, rate in target.shared_rates:
            paces.append((f"group:{group}", CLUSTER_PACE_MARGIN / rate.per_second))
            if target.held_by_a_wait is None or group in target.held_by_a_wait:
                held.append(f"group:{group}")
        limits[name] = TargetLimits(
            target.concurrency, tuple(paces), target.hold_when_down, tuple(held)
        )
    return limits


async def allowed(
    connection: Connection,
    wanted: Mapping[str, int],
    limits: Mapping[str, TargetLimits],
    now: float,
    instance_id: str,
    dead_after: float,
    unanswered: Mapping[int, float] | None = None,
) -> tuple[dict[str, int], dict[str, DownState], list[int]]:
    """How many of each target this instance may claim now, in the caller's
    transaction: the least each of its rules allows (`room`). With them, the
    hold_when_down targets that are down: the one delivery each gives is its
    probe.

    What the rules read stays locked until the transaction ends: each
    target's `claim:` pacing row first (`_lock_paces`), so two instances'
    claims of it take turns and the second sees the first's leases (never two
    probes at once, however stale either instance's memory); then the down
    states' rows (`_down_states`). A lease counts against the concurrency
    until it may be taken over (`_leased`, with the deliveries this
    instance's claims that went unanswered leased, each with its claim's
    moment). Last, the leases a corrected copy waits for that lapsed
    (`_leased`): the caller ends them."""
    known = {target: limits[target] for target in wanted if target in limits}
    if not known:
        return dict(wanted), {}, []
    next_at = await _lock_paces(connection, known)
    leased, stale = await _leased(
        connection, list(known), now, instance_id, dead_after, unanswered or {}
    )
    held = sorted(target for target, rule in known.items() if rule.hold_when_down)
    down = await _down_states(connection, held) if held else {}
    throttled = await _throttled(connection, list(known), now)
    result = {}
    for target, limit in wanted.items():
        rule = known.get(target)
        if rule is not None:
            limit = room(
                limit,
                rule,
                leased.get(target, 0),
                next_at,
                down.get(target),
                now,
                throttled.get(target),
            )
        if limit > 0:
            result[target] = limit
    down_now = {target: state for target, state in down.items() if target in result}
    return result, down_now, stale


def room(
    limit: int,
    rule: TargetLimits,
    leased: int,
    next_at: Mapping[str, float],
    down: DownState | None,
    now: float,
    throttled_until: float | None = None,
) -> int:
    """How many of `limit` deliveries of a target may be claimed: the least
    that each of its rules allows (a rule that does not apply allows any)."""
    rules = (
        concurrency_room(rule, leased),
        pace_room(rule, next_at, now),
        probe_room(down, leased, now),
        throttle_room(throttled_until, leased, now),
    )
    return min([limit, *(allows for allows in rules if allows is not None)])


def concurrency_room(rule: TargetLimits, leased: int) -> int:
    """A target's concurrency is the cluster's: every instance's leases count."""
    return rule.concurrency - leased


def pace_room(rule: TargetLimits, next_at: Mapping[str, float], now: float) -> int | None:
    """A paced target (its rate, its rate groups') sends one delivery at a
    time, once each of its paces has come round (`took` moves them on)."""
    if not rule.paces:
        return None
    return 1 if all(next_at[name] <= now for name, _ in rule.paces) else 0


def probe_room(down: DownState | None, leased: int, now: float) -> int | None:
    """A down target gives one delivery, its probe, once its probe time has
    come (on its backoff, or sooner for fresh evidence: DownState.due) and
    nothing of it is leased anywhere (a probe under way, or an attempt that
    began before it went down): never two probes at once."""
    if down is None:
        return None
    return 1 if down.due <= now and leased == 0 else 0


async def _lock_paces(
    connection: Connection, known: Mapping[str, TargetLimits]
) -> dict[str, float]:
    """Each target's `claim:` pacing row and its paces' rows, locked in name
    order (made at their first claim), with their next allowed moments."""
    names = sorted(
        {f"claim:{t}" for t in known} | {name for rule in known.values() for name, _ in rule.paces}
    )
    lock = "SELECT name, next_at FROM pacing WHERE name = ANY($1::text[]) ORDER BY name FOR UPDATE"
    next_at = {name: at for name, at in await connection.fetch(lock, names)}
    if len(next_at) < len(names):  # a target's or a pace's first claim
        await connection.execute(
            "INSERT INTO pacing (name, next_at) SELECT n, 0 FROM unnest($1::text[]) AS n"
            " ON CONFLICT (name) DO NOTHING",
            names,
        )
        next_at = {name: at for name, at in await connection.fetch(lock, names)}
    return next_at


async def _leased(
    connection: Connection,
    targets: list[str],
    now: float,
    instance_id: str,
    dead_after: float,
    unanswered: Mapping[int, float],
) -> tuple[dict[str, int], list[int]]:
    """Per target, its leases that may not be taken over (`lapsed`); and the
    lapsed ones a corrected copy waits for, which are never taken over but
    ended (relay.store.supersede), read in the same pass."""
    gone = lapsed("$3", "$2", "$4", ("$5::bigint[]", "$6::float8[]"))
    rows = await connection.fetch(
        f"SELECT target, COUNT(*) FILTER (WHERE NOT {gone}),"
        f" array_agg(id) FILTER (WHERE resolved_by IS NOT NULL AND {gone})"
        " FROM deliveries WHERE status = 'in_flight' AND target = ANY($1::text[])"
        " GROUP BY target",
        targets,
        now,
        instance_id,
        dead_after,
        list(unanswered),
        list(unanswered.values()),
    )
    stale = [int(delivery_id) for _, _, ids in rows for delivery_id in ids or ()]
    return {target: count for target, count, _ in rows}, stale


async def _down_states(connection: Connection, held: list[str]) -> dict[str, DownState]:
    """The down ones of these hold_when_down targets (their `targets` rows,
    which every instance writes, not this instance's memory of them).

    Locked (shared) until the claim ends: an attempt recorded meanwhile,
    which locks the row to update it, cannot make the target down (and line
    its deliveries up, due at once) between this read and the claim, which
    would then take them as if it were up."""
    rows = await connection.fetch(
        f"SELECT {TARGET_STATE.columns} FROM targets"
        " WHERE name = ANY($1::text[]) ORDER BY name FOR SHARE",
        held,
    )
    states = map(TARGET_STATE.from_row, rows)
    return {state.name: state.down for state in states if state.down is not None}


async def _throttled(connection: Connection, targets: list[str], now: float) -> dict[str, float]:
    """The targets held by a receiver (relay.delivery.step, rule 4), or in
    a throttle's episode, with when the hold ends, as the instance that met
    it recorded it. Read without a lock: a hold recorded while this claim
    runs is seen by the next one."""
    rows = await connection.fetch(
        "SELECT name, throttled_until FROM targets WHERE name = ANY($1::text[])"
        " AND (throttled_until > $2 OR throttles > 0)",
        targets,
        now,
    )
    return {name: until for name, until in rows}


def throttle_room(until: float | None, leased: int, now: float) -> int | None:
    """A target a receiver holds (`until`: when the hold ends, or ended in a
    throttle's episode still on) gives nothing until the hold ends; then, as
    long as the episode lasts, one delivery at a time for the whole cluster."""
    if until is None:
        return None
    return 1 if until <= now and leased == 0 else 0


async def took(
    connection: Connection,
    counts: Mapping[str, int],
    limits: Mapping[str, TargetLimits],
    now: float,
) -> None:
    """Move each pace on by the sends just claimed (idle time never piles up)."""
    for target, count in counts.items():
        rule = limits.get(target)
        if rule is None or count == 0:
            continue
        for name, interval in rule.paces:
            await connection.execute(
                "UPDATE pacing SET next_at = GREATEST(next_at, $1) + $2 WHERE name = $3",
                now,
                count * interval,
                name,
            )


# This instance ($1) is alive now (by the server's clock); back now, if it
# was silent for dead_after ($2) or more, or stopped.
ALIVE = (
    f"INSERT INTO instances (id, started_at, seen_at, alive_at, beat_at, back_at)"
    f" VALUES ($1, {SERVER_NOW}, {SERVER_NOW}, {SERVER_NOW}, {SERVER_NOW}, {SERVER_NOW})"
    f" ON CONFLICT (id) DO UPDATE SET alive_at = {SERVER_NOW}, beat_at = {SERVER_NOW},"
    f" back_at = CASE WHEN instances.alive_at >= {SERVER_NOW} - $2"
    f" THEN coalesce(instances.back_at, {SERVER_NOW}) ELSE {SERVER_NOW} END"
)
# `relay serve` starts as this instance on this host ($2): a name used
# before (a fixed one, a restart) starts anew, and is back now (it cannot
# know what happened while it was not running).
STARTED = (
    f"INSERT INTO instances (id, host, started_at, seen_at, alive_at, beat_at, back_at)"
    f" VALUES ($1, $2, {SERVER_NOW}, {SERVER_NOW}, {SERVER_NOW}, {SERVER_NOW}, {SERVER_NOW})"
    f" ON CONFLICT (id) DO UPDATE SET host = $2, started_at = {SERVER_NOW},"
    f" alive_at = {SERVER_NOW}, beat_at = {SERVER_NOW}, back_at = {SERVER_NOW}"
)
# The instances (relay stats): $1, $2 the leader lock's two halves as
# pg_locks shows a bigint key, $3 NAME_LOCK; the leader is the instance whose
# name lock (hashtext of its id) is held by the session holding the lead.
# $4 dead_after, $5 how long a gone instance without leases stays listed.
INSTANCES = f"""
WITH leases AS (
    SELECT lease_owner, COUNT(*) AS n FROM deliveries
    WHERE status = 'in_flight' AND lease_owner IS NOT NULL GROUP BY lease_owner),
leader AS (
    SELECT name.objid FROM pg_locks lead
    JOIN pg_locks name ON name.pid = lead.pid AND name.database = lead.database
    WHERE lead.locktype = 'advisory' AND lead.granted AND lead.objsubid = 1
    AND lead.classid = $1::bigint::oid AND lead.objid = $2::bigint::oid
    AND name.locktype = 'advisory' AND name.granted AND name.objsubid = 2
    AND name.classid = $3::bigint::oid
    AND lead.database = (SELECT oid FROM pg_database WHERE datname = current_database())),
listed AS (
    SELECT i.*, coalesce(i.beat_at, i.alive_at, i.seen_at) AS beat, ({SERVER_NOW})::float8 AS now,
        coalesce(leases.n, 0)::int AS leases
    FROM instances i LEFT JOIN leases ON leases.lease_owner = i.id)
SELECT id, host, started_at, beat, now, leases,
    CASE WHEN alive_at IS NULL THEN 'stopped' WHEN alive_at >= now - $4 THEN 'alive'
    ELSE 'silent' END AS state,
    hashtext(id)::bigint & 4294967295 IN (SELECT objid::text::bigint FROM leader) AS leader
FROM listed WHERE beat >= now - $5 OR leases > 0 OR alive_at >= now - $4
ORDER BY id
"""
# It stopped: what it still leases may be taken at once.
STOPPED = "UPDATE instances SET alive_at = NULL WHERE id = $1"


APPLICATION_NAME = "relay/{instance}"


def named(url: str, instance_id: str) -> dict[str, str]:
    """The server settings of each of this instance's connections: its name
    as `application_name` (pg_stat_activity, the server's log), unless the
    URL sets one. The server keeps 63 bytes of it."""
    if "application_name=" in url.partition("?")[2]:
        return {}
    name = APPLICATION_NAME.format(instance=instance_id).encode()[:63]
    return {"application_name": name.decode(errors="ignore")}


async def sessions_shared(first: Connection, second: Connection) -> bool:
    """Whether two open connections reach one server session: a pooler that
    hands sessions out per transaction (PgBouncer's transaction or statement
    mode) lets a lock taken on one be held by both, and by any other client.
    Two connections of their own (or through session pooling) never do."""
    mine = await first.fetchval("SELECT pg_backend_pid()")
    return bool(mine == await second.fetchval("SELECT pg_backend_pid()"))


def beat_interval(dead_after: float) -> float:
    """Seconds between two heartbeats: five within dead_after, so one or two
    lost on a slow network do not make a live instance look gone."""
    return dead_after / 5


async def heartbeats(
    url: str,
    instance_id: str,
    command_timeout: float,
    dead_after: float,
    beaten: Callable[[], None],
) -> None:
    """Touch this instance's row every beat_interval until cancelled, calling
    `beaten` after each touch; errors are retried."""
    every = beat_interval(dead_after)
    while True:
        try:
            connection = await asyncpg.connect(
                url, timeout=command_timeout, server_settings=named(url, instance_id)
            )
            try:
                while True:
                    await connection.execute(
                        ALIVE, instance_id, dead_after, timeout=command_timeout
                    )
                    beaten()
                    await asyncio.sleep(every)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), command_timeout)
        except DRIVER_ERRORS as error:
            log.debug("heartbeat failed, trying again: %s", error)
            await asyncio.sleep(every)


class NamesakeRunning(StoreError):
    """Another running instance has this instance's id: each would take the
    other's leases for its own. Not to be retried: relay stops."""


class Leadership:
    """The instance holding LEADER_LOCK runs the singletons (retention, alerts,
    gauges, the search index). relay.leadership.Leadership is its one caller,
    in `relay serve` only, so its session also holds this instance's name
    (NAME_LOCK)."""

    def __init__(
        self, url: str, timeout: float, dead_after: float = DEAD_AFTER, instance_id: str = ""
    ) -> None:
        self._url = url
        self._timeout = timeout
        self._dead_after = dead_after
        self._instance_id = instance_id
        self._named = False  # this process has held its name
        self._connection: asyncpg.Connection[asyncpg.Record] | None = None
        self._held = False

    async def lead(self) -> bool:
        """Whether this instance leads now; takes the lead when it is free."""
        try:
            if self._connection is None or self._connection.is_closed():
                self._held = False
                self._connection = await asyncpg.connect(
                    self._url,
                    timeout=self._timeout,
                    server_settings=named(self._url, self._instance_id),
                )
                if self._connection.get_server_version().major >= 14:
                    # A leader that hangs (a frozen VM, a lost network) loses its
                    # session, and so the lead, once silent for dead_after: it
                    # speaks on this connection at every check.
                    await self._connection.execute(
                        f"SET idle_session_timeout = {int(self._dead_after * 1000)}",
                        timeout=self._timeout,
                    )
                if not await self._hold_name(self._connection):
                    return False
            if not self._held:
                self._held = bool(
                    await self._connection.fetchval(
                        "SELECT pg_try_advisory_lock($1)", LEADER_LOCK, timeout=self._timeout
                    )
                )
            else:
                # Still the same session (a lost session lost the lock with it).
                await self._connection.fetchval("SELECT 1", timeout=self._timeout)
        except DRIVER_ERRORS:
            await self.close()
            return False
        return self._held

    async def _hold_name(self, connection: asyncpg.Connection[asyncpg.Record]) -> bool:
        """Two running instances with one name would each give back the other's
        attempts as its own: the second one refuses to run. A name whose
        instance died is free at once (kill -9), or after dead_after (a hang).

        Once this process held its name, a name still held when it connects
        again is its own lost session, which the server has not ended yet:
        it tries again at the next check (not leading meanwhile)."""
        free = await connection.fetchval(
            "SELECT pg_try_advisory_lock($1, hashtext($2))",
            NAME_LOCK,
            self._instance_id,
            timeout=self._timeout,
        )
        if free:
            self._named = True
            return True
        await self.close()
        if self._named:
            return False
        raise NamesakeRunning(
            f"another relay instance named {self._instance_id!r} is running on this"
            " database: give each instance its own [storage] instance_id"
        )

    async def close(self) -> None:
        self._held = False
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._connection.close(), self._timeout)
            self._connection = None


async def listen_forever(
    url: str, channel: str, callback: Callable[[str], None], instance_id: str
) -> None:
    """Call `callback` with each notification on `channel` until cancelled,
    connecting again when the connection breaks."""
    while True:
        try:
            connection = await asyncpg.connect(
                url, timeout=10, server_settings=named(url, instance_id)
            )
        except DRIVER_ERRORS:
            await asyncio.sleep(1.0)
            continue
        try:

            def received(_: object, __: int, ___: str, payload: object) -> None:
                callback(str(payload))

            await connection.add_listener(channel, received)
            callback("listening")  # anything missed while not listening is due now
            while not connection.is_closed():
                await asyncio.sleep(1.0)
                try:
                    await connection.fetchval("SELECT 1", timeout=5)
                except DRIVER_ERRORS:
                    break
        except DRIVER_ERRORS:
            await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 5)
