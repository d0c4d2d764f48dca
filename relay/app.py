"""Wiring and lifecycle: the store, the targets, the scheduler and the listeners."""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from relay.admin import Operator, admin_application
from relay.alerts import Alerter
from relay.clock import Clock, SystemClock
from relay.config import Config, Listen, StorageConfig
from relay.ingress import Ingress
from relay.lockfile import ProcessLock
from relay.logs import log_attempt
from relay.metrics import Metrics
from relay.retention import RetentionJob
from relay.retry import Next
from relay.scheduler import AttemptReport, Scheduler
from relay.secrets import Masker
from relay.store import SqliteStore
from relay.targets import Target, build_target

log = logging.getLogger("relay")


def open_store(storage: StorageConfig) -> SqliteStore:
    return SqliteStore(
        storage.path,
        synchronous=storage.synchronous,
        busy_timeout=storage.busy_timeout,
        # A request waits at most this long for a place in a commit before 503.
        write_queue_timeout=storage.busy_timeout + 1.0,
    )


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + ".lock")


def _url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
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
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.masker = Masker(config.secrets)
        self.metrics = Metrics()
        self.store = open_store(config.storage)
        self.targets: dict[str, Target] = {
            name: build_target(target) for name, target in config.targets.items()
        }
        self._log_attempts = log_attempts
        self.scheduler = Scheduler(
            self.store,
            config,
            self.targets,
            self.clock,
            masker=self.masker,
            rng=rng,
            poll_interval=poll_interval,
            on_attempt=self._observe_attempt,
        )
        self.alerter = Alerter(
            config.alerts,
            self.store,
            self.clock,
            on_created=self._count_alert,
        )
        self.retention = RetentionJob(self.store, config, self.clock)
        self.ingress = Ingress(
            config,
            self.store,
            self.clock,
            metrics=self.metrics,
            on_accepted=self.scheduler.wake,
        )
        self.operator = Operator(
            store=self.store,
            scheduler=self.scheduler,
            clock=self.clock,
            metrics=self.metrics,
            current_config=lambda: self.config,
            store_stats=lambda: self.store.write_stats,
        )
        self._lock = ProcessLock(lock_path(config.storage.path))
        self._runners: dict[str, web.AppRunner] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._opened: list[Callable[[], object]] = []

    @property
    def ingress_url(self) -> str:
        return _url(self._runners["ingress"])

    @property
    def admin_url(self) -> str:
        return _url(self._runners["admin"])

    def _count_alert(self, body: dict[str, Any]) -> None:
        for kind, present in (
            ("dead", body["dead_count"]),
            ("failing", body["failing"]),
            ("recovered", body["recovered"]),
        ):
            if present:
                self.metrics.alerts.labels(kind).inc()

    def _observe_attempt(self, report: AttemptReport) -> None:
        target = report.delivery.target
        self.metrics.attempts.labels(target, report.outcome.verdict.value).inc()
        self.metrics.attempt_seconds.labels(target).observe(report.duration)
        if report.decision.next is Next.DEAD:
            self.metrics.dead.labels(report.delivery.route, target).inc()
        if self._log_attempts:
            log_attempt(report)
        self.alerter.observe(report)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(coroutine, name=name))

    async def _listen(self, name: str, app: web.Application, listen: Listen) -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runners[name] = runner
        await web.TCPSite(runner, listen.host, listen.port, backlog=1024).start()

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
            recovered = await self.store.recover_orphans(self.clock.now())
            if recovered:
                log.warning(
                    "%d deliveries were in flight when relay last stopped; retrying them",
                    recovered,
                )
            for target in self.targets.values():
                await target.start()
                self._opened.append(target.close)
            if background:
                self._spawn(self.scheduler.run(), "scheduler")
                self._spawn(self.alerter.run(), "alerts")
                self._spawn(self.retention.run(), "retention")
            await self._listen("ingress", self.ingress.application(), self.config.server.listen)
            admin = self.config.admin
            if admin.enabled:
                await self._listen("admin", admin_application(self.operator), admin.listen)
                if admin.token is None:
                    log.warning(
                        "admin API on %s has no token: anyone on this machine can use it",
                        admin.listen,
                    )
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop taking webhooks, finish what is in flight, close everything."""
        ingress = self._runners.pop("ingress", None)
        if ingress is not None:
            # Stops listening and lets requests waiting on a commit get their answer.
            await ingress.cleanup()
        await self.ingress.close()
        await self.scheduler.stop(self.config.server.shutdown_timeout)
        self.retention.stop()
        await self.alerter.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        admin = self._runners.pop("admin", None)
        if admin is not None:
            await admin.cleanup()
        while self._opened:
            closer = self._opened.pop()
            result = closer()
            if asyncio.iscoroutine(result):
                await result


async def serve(config: Config) -> int:
    """`relay serve`: run until SIGTERM or SIGINT, then stop cleanly and return 0."""
    relay = Relay(config)
    await relay.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    admin = f", admin on {relay.admin_url}" if config.admin.enabled else ""
    log.info(
        "relay ready: ingress on %s%s, %d routes, %d targets, database %s",
        relay.ingress_url,
        admin,
        len(config.routes),
        len(config.targets),
        config.storage.path,
    )
    await stop.wait()
    log.info("stopping: finishing attempts in flight (up to %gs)", config.server.shutdown_timeout)
    await relay.stop()
    log.info("stopped")
    return 0
