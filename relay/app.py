"""Wiring and lifecycle: the store, the targets, the scheduler and the listeners."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import inspect
import logging
import os
import random
import signal
import socket
from collections.abc import Callable, Coroutine, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from relay.admin import Console, admin_application
from relay.admin.site import CappedSite
from relay.background.alerts import Alerter
from relay.background.dbwatch import DatabaseWatch
from relay.background.indexer import SearchIndexer
from relay.background.leadership import CHECK_EVERY, Leadership
from relay.background.memory import QUIET_SECONDS, MemoryRelease
from relay.background.noticed import ActionsNoticed
from relay.background.retention import RetentionJob
from relay.background.silence import SilenceWatch
from relay.config import Config, ConfigError, Listen
from relay.config.files import write_token_file
from relay.core.clock import Clock, SystemClock
from relay.core.errors import one_line
from relay.core.records import Dead
from relay.core.secrets import Masker
from relay.core.units import format_instant
from relay.delivery.scheduler import AttemptReport, Scheduler
from relay.ingress.guard import ConnectionCap, connection_limits
from relay.ingress.httplog import server_log
from relay.ingress.listener import Ingress
from relay.kinds.target import Target
from relay.loader import load_config
from relay.loader.registry import build_target
from relay.ops import logs
from relay.ops.logs import log_attempt
from relay.ops.metrics import Metrics
from relay.ops.systemd import BACKLOG, ActivationError, Notifier, inherited_listeners, watchdog
from relay.store import INTERRUPTED_LIMIT, Status, StoreError, open_store, serve_lock
from relay.store.base import Shared

log = logging.getLogger("relay")


def with_admin_token(config: Config) -> Config:
    """`config` with its admin token: one is written to `admin.token_file` if missing,
    so that the listener never runs without a token just because none was set."""
    admin = config.admin
    if admin.token is not None or admin.token_file is None:
        return config
    try:
        token = write_token_file(admin.token_file)
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise ConfigError(
            "admin.token_file", f"cannot write {admin.token_file}: {reason}"
        ) from None
    log.warning(
        "admin token written to %s: the API and the dashboard's sign-in ask for it",
        admin.token_file,
    )
    return dataclasses.replace(
        config,
        admin=dataclasses.replace(admin, token=token),
        secrets=config.secrets | {token},
    )


@dataclass(frozen=True)
class Service:
    """A part of relay that runs beside the listeners until stopped: started
    in the order of `Relay.services`, stopped in the same order. An essential
    one must run until then: if it ends any other way, relay stops rather than
    run without it (procrastinate's `_monitor_side_tasks`), and systemd
    restarts it."""

    name: str  # its task's name, and what a stop's log line says it is doing
    run: Callable[[], Coroutine[Any, Any, None]]
    stop: Callable[[], object]
    essential: bool = True


class StartError(Exception):
    """relay cannot start (a port in use): one line for the log, exit code 1."""


def _url(runner: web.BaseRunner) -> str:
    host, port = runner.addresses[0][:2]
    return _url_of(host, port)


def _url_of(host: str, port: int) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


class Relay:
    """One relay process. `start()` then `stop()`; tests drive it in-process."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        poll_interval: float = 1.0,
        log_attempts: bool = True,
        memory_quiet: float = QUIET_SECONDS,
        listeners: Mapping[str, socket.socket] | None = None,
    ) -> None:
        config = with_admin_token(config)
        logs.reconfigure(config)  # a token just written is masked from the first line
        self.config = config
        # Why the last reload was refused; None once one succeeds (status_line).
        self.reload_problem: str | None = None
        self.clock = clock or SystemClock()
        self.store = open_store(config.storage)
        shared = self.store if isinstance(self.store, Shared) else None
        self.metrics = Metrics(cluster=shared is not None)
        self.metrics.configure(config)
        # On PostgreSQL one instance of the cluster runs retention, alert
        # grouping, the queue gauges and the search index: the one leading.
        # On SQLite, this one.
        self.leadership = Leadership(
            shared.lead if shared is not None else None,
            # The leader speaks often enough that the server never takes it for
            # dead (idle_session_timeout = dead_after) while it is alive.
            every=min(CHECK_EVERY, config.storage.dead_after / 4),
        )
        self.targets: dict[str, Target] = {
            name: build_target(target) for name, target in config.targets.items()
        }
        self._log_attempts = log_attempts
        self.scheduler = Scheduler(
            self.store,
            config,
            self.targets,
            self.clock,
            rng=rng,
            poll_interval=poll_interval,
            on_attempt=self._observe_attempt,
        )
        self.alerter = Alerter(
            config.alerts,
            self.store,
            self.clock,
            on_created=self._count_alert,
            shared=shared,
            leading=self._leading,
        )
        self.retention = RetentionJob(
            self.store, config, self.clock, self.metrics.purged.inc, leading=self._leading
        )
        # A new leader purges and sends what waits at once, not at its next pass.
        self.leadership.on_gained(self.retention.wake)
        self.leadership.on_gained(self.alerter.wake)
        if shared is not None:
            shared.reconfigure(config)
        self.indexer = SearchIndexer(
            self.store,
            self.clock,
            config.masker,
            leading=self._leading,
            one_writer=shared is None,
            on_flagged=self._flagged,
        )
        self.leadership.on_gained(self.indexer.lead_taken)
        # Routes whose senders stopped sending: learnt and judged by the leader.
        self.silence = SilenceWatch(
            self.store, config, self.clock, self.alerter.tell, leading=self._leading
        )
        self.leadership.on_gained(self.silence.wake)
        self.database_watch = DatabaseWatch(self.store, self.alerter)
        self.noticed = ActionsNoticed(self.store)
        self.memory = MemoryRelease(
            self.store,
            self.metrics.activity,
            quiet=memory_quiet,
            every=min(memory_quiet, 5.0),
            bodies=self._bodies_held,
        )
        self.ingress = Ingress(
            config,
            self.store,
            self.clock,
            metrics=self.metrics,
            on_accepted=self._accepted,
        )
        self.console = Console(
            store=self.store,
            scheduler=self.scheduler,
            clock=self.clock,
            metrics=self.metrics,
            current_config=lambda: self.config,
            store_stats=lambda: self.store.write_stats,
            leading=self._leading,
            route_health=self._route_health,
        )
        # Everything that runs beside the listeners, in the order it starts and stops.
        self.services = [
            Service("scheduler", self.scheduler.run, lambda: self.scheduler.stop(self._grace())),
            Service("retention", self.retention.run, self.retention.stop),
            Service("search-indexer", self.indexer.run, self.indexer.stop),
            Service("silence-watch", self.silence.run, self.silence.stop),
            Service("database-watch", self.database_watch.run, self.database_watch.stop),
            Service("actions-noticed", self.noticed.run, self.noticed.stop, essential=False),
            Service("memory-release", self.memory.run, self.memory.stop, essential=False),
            Service("alerts", self.alerter.run, self.alerter.stop),
        ]
        if shared is not None:
            # Other instances' new events and operator actions wake this one.
            listening = Listening(lambda: shared.listen(self._woken))
            self.services += [
                Service("wake-ups", listening.run, listening.stop),
                Service("leadership", self.leadership.run, self.leadership.stop),
            ]
        self._lock = serve_lock(config.storage)
        # Listening sockets systemd passed (socket activation), by name: used
        # instead of binding server.listen / admin.listen.
        self._inherited = dict(listeners or {})
        # The listeners that came from systemd, at the address each listens on.
        self.from_systemd: dict[str, Listen] = {}
        # When a stop must be over, and when attempts in flight must be (`stop`).
        self._stop_by: float | None = None
        self._attempts_by: float | None = None
        self._runners: dict[str, web.BaseRunner] = {}
        self._ingress_listener: asyncio.Server | None = None
        self.connection_caps: dict[str, ConnectionCap | None] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._opened: list[Callable[[], object]] = []
        self._stopping = False
        # Set when a background task ends while relay is not stopping: `serve()`
        # then stops the process with a non-zero exit, so systemd restarts it.
        self.died = asyncio.Event()

    @property
    def masker(self) -> Masker:
        """The running config's masker (the one every component was given)."""
        return self.config.masker

    @property
    def ingress_url(self) -> str:
        assert self._ingress_listener is not None
        host, port = self._ingress_listener.sockets[0].getsockname()[:2]
        return _url_of(host, port)

    @property
    def admin_url(self) -> str:
        return _url(self._runners["admin"])

    def _bodies_held(self) -> tuple[int, int]:
        """Request bodies held now, and the most held since the last call."""
        held, peak = self.ingress.bodies_in_flight, self.ingress.bodies_peak
        self.ingress.bodies_peak = held
        return held, peak

    def _leading(self) -> bool:
        return self.leadership.leading

    def _flagged(self, event_id: int) -> None:
        """A background pass skipped a stored event relay stopped on: a person
        must know (relay.background.indexer)."""
        self.alerter.problem(
            f"relay stopped while indexing event {event_id} for search: it is now"
            f" left out of the search index and flagged (relay show {event_id});"
            " its deliveries go on"
        )

    def _accepted(self, route: str) -> None:
        self.scheduler.arrived(route)
        self.indexer.noticed()  # it indexes once arrivals pause, not amid them

    def _woken(self, what: str) -> None:
        if what == "pause":
            self.scheduler.targets_changed()
        else:
            self.scheduler.wake()
        self.indexer.noticed()

    def _count_alert(self, body: dict[str, Any]) -> None:
        for kind, present in (
            ("dead", body["dead_count"]),
            ("keeps_failing", body["keeps_failing_count"]),
            ("failing", body["failing"]),
            ("recovered", body["recovered"]),
            ("down", body["down"]),
            ("up", body["up"]),
            ("silent", body["silent"]),
            ("back", body["back"]),
        ):
            if present:
                self.metrics.alerts.labels(kind).inc()

    def _route_health(self) -> dict[tuple[str, str], tuple[int, str]]:
        health = self.alerter.health
        return {key: (n, health.errors.get(key, "")) for key, n in health.streaks.items()}

    def _observe_attempt(self, report: AttemptReport) -> None:
        target = report.delivery.target
        self.metrics.count_attempt(report.delivery.route, target, report.said, report.duration)
        if isinstance(report.then, Dead):
            self.metrics.dead.labels(report.delivery.route, target).inc()
        if self._log_attempts:
            log_attempt(report)
        self.alerter.observe(report)

    def _spawn(
        self, coroutine: Coroutine[Any, Any, None], name: str, *, essential: bool = False
    ) -> None:
        """Run `coroutine` in the background (see `Service` for `essential`)."""
        self._tasks = [task for task in self._tasks if not task.done()]
        task = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._essential_ended if essential else self._helper_ended)
        self._tasks.append(task)

    def _essential_ended(self, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        log.error(
            "background task %s %s: stopping relay so that it is restarted",
            task.get_name(),
            _how_it_ended(task),
        )
        self.died.set()

    def _helper_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s %s", task.get_name(), _how_it_ended(task))

    async def _listen_ingress(self, limit: int) -> None:
        listen = self.config.server.listen
        cap = ConnectionCap(self.ingress.server(), limit, "ingress")
        loop = asyncio.get_running_loop()
        inherited = self._inherited.pop("ingress", None)
        try:
            if inherited is not None:
                self._ingress_listener = await loop.create_server(
                    cap, sock=inherited, backlog=BACKLOG
                )
            else:
                self._ingress_listener = await loop.create_server(
                    cap, listen.host, listen.port, backlog=BACKLOG
                )
        except OSError as error:
            raise _cannot_listen(listen, "ingress", error) from None
        self.connection_caps["ingress"] = cap
        if inherited is not None:
            self._activated("ingress", inherited, listen, "server.listen")

    def _activated(self, name: str, sock: socket.socket, listen: Listen, key: str) -> Listen:
        """Note a listener systemd passed; say so when the config names another
        address. The socket unit's wins: it is the address systemd listens on
        while relay is stopped, and the one relay is given."""
        host, port = sock.getsockname()[:2]
        bound = Listen(host, port)
        self.from_systemd[name] = bound
        if bound != listen:
            log.warning(
                "%s is %s, but the %s socket systemd passed listens on %s: systemd's"
                " (ListenStream= of its socket unit) is used; make them the same",
                key,
                listen,
                name,
                bound,
            )
        return bound

    async def _close_ingress(self) -> None:
        """The ingress's part of a stop, last: see `stop`."""
        listener, self._ingress_listener = self._ingress_listener, None
        if listener is None:
            return
        await self.ingress.server().drain(listener.close, self._stop_by or 0.0)
        await listener.wait_closed()

    async def _listen_admin(self, app: web.Application, listen: Listen, limit: int) -> None:
        inherited = self._inherited.pop("admin", None)
        if inherited is not None:
            bound = self._activated("admin", inherited, listen, "admin.listen")
            if self.config.admin.token is None and not bound.is_loopback:
                inherited.close()
                raise StartError(
                    f"the admin socket systemd passed listens on {bound}, not on loopback,"
                    " and [admin] has no token: set admin.token, or ListenStream=127.0.0.1:PORT"
                    " in relay-admin.socket"
                )
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            logger=server_log,
            # An idle dashboard or API connection is closed, not kept for an hour.
            keepalive_timeout=self.config.server.read_timeout,
            # At a stop, how long its requests under way may finish (see `stop`).
            shutdown_timeout=ADMIN_GRACE,
        )
        await runner.setup()
        self._runners["admin"] = runner
        try:
            site = CappedSite(
                runner,
                listen.host,
                listen.port,
                limit=limit,
                name="admin",
                # aiohttp has no deadline for a trickled head; health probes
                # are answered even with every slot busy.
                head_timeout=self.config.server.read_timeout,
                probes=True,
                sock=inherited,
            )
            await site.start()
        except OSError as error:
            raise _cannot_listen(listen, "admin", error) from None
        self.connection_caps["admin"] = site.cap

    async def start(self, *, background: bool = True) -> None:
        """Open everything in order; a failure undoes what was opened.

        `background=False` leaves the scheduler, alerts and retention to the
        caller (tests drive them with `drain()` on an injected clock).
        """
        try:
            self._lock.acquire()
            self._opened.append(self._lock.release)
            await self.store.open()
            self._opened.append(self.store.close)
            # Whether this instance leads is known before anything asks.
            await self.leadership.check()
            now = self.clock.now()
            # The routes failing when relay last stopped (their streaks go on).
            await self.alerter.load()
            recovered = await self.store.recover_orphans(now)
            if recovered.taken_back:
                log.warning(
                    "%d deliveries were in flight when relay last stopped; retrying them",
                    recovered.taken_back - len(recovered.parked),
                )
            for delivery_id in recovered.parked:
                said = (
                    f"delivery {delivery_id} is parked dead: relay stopped"
                    f" {INTERRUPTED_LIMIT} times in a row while sending it, so it is"
                    " not sent again until a person requeues it"
                )
                log.error("%s (relay show %d)", said, delivery_id)
                self.alerter.problem(said)
            await self._report_unconfigured()
            self._opened.append(self._close_targets)
            for target in self.targets.values():
                await target.start()
            if background:
                for service in self.services:
                    self._spawn(service.run(), service.name, essential=service.essential)
            ingress_cap, admin_cap = connection_limits()
            await self._listen_ingress(ingress_cap)
            admin = self.config.admin
            if admin.enabled:
                await self._listen_admin(admin_application(self.console), admin.listen, admin_cap)
                if admin.token is None:
                    log.warning(
                        "admin API on %s has no token: anyone on this machine can use it",
                        self.from_systemd.get("admin", admin.listen),
                    )
            for name in list(self._inherited):
                log.warning(
                    "systemd passed the %s socket, which relay does not use ([admin] enabled"
                    " = false): its connections would wait unanswered; take its unit out of"
                    " Sockets= and Requires= in relay.service, and disable it",
                    name,
                )
            self._close_inherited()
        except BaseException:
            await self.stop()
            raise

    async def _report_unconfigured(self) -> None:
        waiting = await self.store.flag_unconfigured(list(self.config.targets), self.clock.now())
        for target, count in sorted(waiting.items()):
            log.warning(
                "%d deliveries wait for target %s, which is not in the config:"
                " they are kept until it is back",
                count,
                target,
            )

    async def _close_targets(self) -> None:
        for target in self.targets.values():
            await target.close()

    async def reload(self, config: Config) -> list[str]:
        """Switch to `config` while running. Routes, targets, templates and policies
        change at once; attempts in flight finish on the targets they started with.
        Returns the keys whose change needs a restart (those keep their old value)."""
        config = with_admin_token(config)
        old = self.config
        if old.routes and not config.routes:
            # An empty file (an editor that saved on a full disk) or the routes
            # cut away: valid TOML, but applied it would answer 404 to every sender.
            raise ConfigError(
                "routes",
                "none in the new file: every webhook would get 404; the running routes"
                " stay (to run without routes, restart)",
            )
        needs_restart = []
        if config.server.listen != old.server.listen:
            needs_restart.append("server.listen")
        if (config.admin.listen, config.admin.enabled) != (old.admin.listen, old.admin.enabled):
            needs_restart.append("admin.listen")
        if config.storage != old.storage:
            needs_restart.append("storage")
        bound = old.admin.listen
        if old.admin.enabled and config.admin.token is None and not bound.is_loopback:
            # The new file may move the listener to loopback, but the one bound
            # (off loopback) stays until a restart: it must keep a token.
            raise ConfigError(
                "admin.token",
                f"is required while the admin listener is bound to {bound} (not loopback);"
                " a new admin.listen takes effect only at a restart",
            )
        config = dataclasses.replace(
            config,
            server=dataclasses.replace(config.server, listen=old.server.listen),
            admin=dataclasses.replace(
                config.admin, listen=old.admin.listen, enabled=old.admin.enabled
            ),
            storage=old.storage,
        )
        targets: dict[str, Target] = {}
        fresh: list[Target] = []
        try:
            for name, target_config in config.targets.items():
                current = self.targets.get(name)
                if current is not None and old.targets.get(name) == target_config:
                    targets[name] = current
                    continue
                target = build_target(target_config)
                await target.start()
                fresh.append(target)
                targets[name] = target
        except BaseException:
            for target in fresh:
                await _quietly(f"closing target {target.name}", target.close)
            raise
        retired = [t for name, t in self.targets.items() if targets.get(name) is not t]
        self.config = config
        self.targets = targets
        self.metrics.configure(config)
        self.scheduler.reconfigure(config, targets)
        if isinstance(self.store, Shared):
            self.store.reconfigure(config)
        self.ingress.reconfigure(config)
        self.alerter.reconfigure(config)
        self.retention.reconfigure(config)
        self.silence.reconfigure(config)
        self.indexer.reconfigure(config)
        logs.reconfigure(config)
        for target in retired:
            self._spawn(self._retire(target), "retire-target")
        # The new config is in place now: a store hiccup here must not be
        # reported as a failed reload.
        with contextlib.suppress(StoreError):
            await self._report_unconfigured()
        return needs_restart

    async def _retire(self, target: Target) -> None:
        await self.scheduler.until_unused(target)
        await target.close()
        # An attempt that was in flight during the reload has just written its
        # own error over the "not configured" note: put the note back.
        await self._report_unconfigured()

    async def status_line(self) -> str:
        """One line for systemd's STATUS: pending, dead, last delivery.

        On a cluster only the leading instance counts the queue (as only it
        exports the gauges); the others say that they follow. A failed reload
        leads it until the next one succeeds: `systemctl status` keeps showing
        it, not only for the seconds until the next refresh."""
        if self.reload_problem is not None:
            return f"reload failed (previous config kept): {self.reload_problem}; " + (
                await self._queue_line()
            )
        return await self._queue_line()

    async def _queue_line(self) -> str:
        states = await self.store.target_states()
        last = max((s.last_success_at or 0.0 for s in states.values()), default=0.0)
        when = format_instant(last) if last else "none yet"
        if not self.leadership.leading:
            return f"following the cluster's leading instance, last delivery {when}"
        gauges = await self.store.gauges()
        pending = sum(n for (_, status), n in gauges.counts.items() if status is Status.PENDING)
        dead = sum(n for (_, status), n in gauges.counts.items() if status is Status.DEAD)
        leading = "leading the cluster: " if self.leadership.shared else ""
        return f"{leading}pending {pending}, dead {dead}, last delivery {when}"

    def _grace(self) -> float:
        """How long attempts in flight may still take to finish (`stop`)."""
        if self._attempts_by is None:
            return self.config.server.shutdown_timeout
        return max(0.0, self._attempts_by - asyncio.get_running_loop().time())

    def _close_inherited(self) -> None:
        for sock in self._inherited.values():
            sock.close()
        self._inherited.clear()

    async def stop(self) -> bool:
        """Stop delivering first and taking webhooks last, within one budget.

        `server.shutdown_timeout` is the whole stop's (the unit's
        TimeoutStopSec= is longer by what closing the database takes). The
        scheduler stops claiming, and attempts in flight may finish until all
        but the ingress's share of it (INGRESS_SHARE, at most a quarter) is
        spent, while webhooks are still answered as always; then the other
        services stop and the admin listener closes. The ingress goes last
        (`Http1Server.drain`): every answer closes its connection, idle
        connections are closed, the listener stops accepting (under socket
        activation new connections wait in systemd's queue for the next
        process), and the requests already read are answered, by the end of
        the budget. Then the targets, the database and its lock.

        Each step runs even when one before it failed (a failure is one log
        line): the database and its lock are always let go. True if all went well.
        """
        self._stopping = True
        budget = self.config.server.shutdown_timeout
        self._stop_by = asyncio.get_running_loop().time() + budget
        self._attempts_by = self._stop_by - min(INGRESS_SHARE, budget / 4)
        tasks, self._tasks = self._tasks, []
        steps: list[tuple[str, Callable[[], object]]] = [
            (f"stopping {service.name}", service.stop) for service in self.services
        ]
        steps.append(("waiting for tasks", lambda: asyncio.gather(*tasks, return_exceptions=True)))
        admin = self._runners.pop("admin", None)
        if admin is not None:
            steps.append(("closing the admin listener", admin.cleanup))
        steps += [
            ("closing the ingress listener", self._close_ingress),
            ("closing ingress", self.ingress.close),
        ]
        steps += [("closing", closer) for closer in reversed(self._opened)]
        self._opened.clear()
        steps.append(("closing sockets not used", self._close_inherited))
        clean = True
        for what, step in steps:
            clean &= await _quietly(what, step)
        return clean


class Listening:
    """A wait for other instances' news, which has no end of its own: it
    listens until stopped."""

    def __init__(self, listen: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._listen = listen
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        self._task = asyncio.current_task()
        await self._listen()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _cannot_listen(listen: Listen, name: str, error: OSError) -> StartError:
    reason = error.strerror or str(error)
    if error.errno == errno.EADDRINUSE:
        reason = "the address is already in use (is another relay running?)"
    return StartError(f"cannot listen on {listen} ({name}): {reason}")


def _how_it_ended(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "was cancelled"
    error = task.exception()
    if error is None:
        return "ended"
    return f"failed: {type(error).__name__}: {error}"


SLOW_STOP_STEP = 5.0
# Of a stop's budget, what the ingress keeps for its part, last (at most a
# quarter of it): closing its idle connections, then answering the requests it
# has read, whose commits take milliseconds (busy_timeout at worst).
INGRESS_SHARE = 5.0
# How long the admin listener's requests under way may finish at a stop: its
# requests are an operator's, short; the budget is the webhooks'.
ADMIN_GRACE = 1.0


async def _quietly(what: str, step: Callable[[], object]) -> bool:
    """Run one step of a shutdown; a failure is logged in one line, not raised."""
    try:
        result = step()
        if inspect.isawaitable(result):
            waiting = asyncio.ensure_future(result)
            # A stop that takes long says what it is waiting for (systemd's
            # TimeoutStopSec would otherwise kill it without a word).
            while True:
                done, _ = await asyncio.wait([waiting], timeout=SLOW_STOP_STEP)
                if done:
                    waiting.result()
                    break
                log.warning("stopping: still %s", what)
    except Exception as error:
        log.error("%s failed: %s", what, one_line(error))
        return False
    return True


async def serve(config: Config, environ: MutableMapping[str, str] | None = None) -> int:
    """`relay serve`: run until SIGTERM or SIGINT; SIGHUP re-reads the config.
    The listeners are systemd's when it passed them (socket activation), else
    bound here.

    Returns the exit code: 0 after a requested stop, 1 when relay could not
    start or a background task died (systemd then restarts it)."""
    notifier = Notifier(environ)
    try:
        relay = Relay(config, listeners=inherited_listeners(environ))
        await relay.start()
    except (StartError, ConfigError, ActivationError) as error:
        log.error("%s", error)
        return 1
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    try:
        code = await _run(relay, notifier, loop)
    finally:
        # Whatever happened above, the listeners close, the attempts in flight
        # finish and the database lock is released: never a process half alive.
        # While stopping, a SIGHUP (whose default action kills) is ignored and
        # another SIGTERM changes nothing; the handlers go when all is closed.
        for signum in signals:
            loop.add_signal_handler(signum, log.info, "already stopping: signal %d ignored", signum)
        notifier.stopping()
        log.info(
            "stopping within %gs: attempts in flight finish while webhooks are answered,"
            " then the listeners close",
            relay.config.server.shutdown_timeout,
        )
        clean = await relay.stop()
        for signum in signals:
            loop.remove_signal_handler(signum)
        log.info("stopped")
    return code if clean else max(code, 1)


async def _run(relay: Relay, notifier: Notifier, loop: asyncio.AbstractEventLoop) -> int:
    config = relay.config
    # Everything built so far lives as long as the process: keep it out of the
    # collector's way, and collect the young generation less often. Each
    # request allocates a few hundred short-lived objects, and at Python's
    # default threshold (700) the collector would run every couple of requests.
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)

    stop = asyncio.Event()
    reload = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload.set)
    if relay.from_systemd:
        log.info(
            "listeners from systemd (socket activation): %s%s",
            ", ".join(f"{name} on {listen}" for name, listen in relay.from_systemd.items()),
            "".join(
                f"; {name} bound by relay"
                for name, enabled in (("ingress", True), ("admin", config.admin.enabled))
                if enabled and name not in relay.from_systemd
            ),
        )
    admin = f", admin on {relay.admin_url}" if config.admin.enabled else ""
    # In a cluster, which instance this is (its leases, its connections' name).
    instance = f" as instance {relay.store.instance_id}" if isinstance(relay.store, Shared) else ""
    log.info(
        "relay ready: ingress on %s%s, %d routes, %d targets, database %s%s",
        relay.ingress_url,
        admin,
        len(config.routes),
        len(config.targets),
        config.storage.location(),
        instance,
    )
    notifier.ready(await relay.status_line())
    pinger = asyncio.create_task(
        watchdog(notifier, relay.scheduler.alive, relay.status_line), name="watchdog"
    )
    try:
        while not stop.is_set():
            waiters = [
                asyncio.create_task(stop.wait()),
                asyncio.create_task(reload.wait()),
                asyncio.create_task(relay.died.wait()),
            ]
            await asyncio.wait([*waiters, pinger], return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if relay.died.is_set():
                return 1
            if pinger.done():
                log.error("background task watchdog %s: stopping relay", _how_it_ended(pinger))
                return 1
            if reload.is_set() and not stop.is_set():
                reload.clear()
                await _reload(relay, notifier)
        return 0
    finally:
        pinger.cancel()


async def _reload(relay: Relay, notifier: Notifier) -> None:
    notifier.reloading()
    source = relay.config.source
    try:
        if source is None:
            raise ConfigError("", "the running config was not read from a file")
        config = load_config(source, os.environ)
        needs_restart = await relay.reload(config)
    except Exception as error:
        # Whatever went wrong, the running config stays: one line, counted.
        problem = str(error) if isinstance(error, ConfigError) else one_line(error)
        relay.metrics.reloads.labels("failed").inc()
        relay.metrics.reload_failed.set(1)
        log.error("reload failed, still running the previous config: %s", problem)
        relay.reload_problem = problem
        notifier.send("READY=1", f"STATUS={await _status_or_trouble(relay)}")
        return
    relay.reload_problem = None
    relay.metrics.reloads.labels("ok").inc()
    relay.metrics.reload_failed.set(0)
    log.info("reloaded %s: %d routes, %d targets", source, len(config.routes), len(config.targets))
    sockets = {"server.listen": "ingress", "admin.listen": "admin"}
    for key in needs_restart:
        if sockets.get(key) in relay.from_systemd:
            log.warning(
                "%s changed, but the %s socket is systemd's: change ListenStream= in its"
                " socket unit too, then restart the socket",
                key,
                sockets[key],
            )
        else:
            log.warning("%s changed: it takes effect at the next restart", key)
    notifier.send("READY=1", f"STATUS={await _status_or_trouble(relay)}")


async def _status_or_trouble(relay: Relay) -> str:
    try:
        return await relay.status_line()
    except StoreError as error:
        failed = relay.reload_problem
        kept = f"reload failed (previous config kept): {failed}; " if failed else ""
        return f"{kept}store unavailable: {error}"
