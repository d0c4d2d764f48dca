"""Wiring and lifecycle: the store, the targets, the scheduler and the listeners."""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from relay.clock import Clock, SystemClock
from relay.config import Config
from relay.ingress import Ingress
from relay.lockfile import ProcessLock
from relay.logs import log_attempt
from relay.scheduler import AttemptReport, Scheduler
from relay.secrets import Masker
from relay.store import SqliteStore
from relay.targets import Target, build_target

log = logging.getLogger("relay")


def open_store(config: Config) -> SqliteStore:
    storage = config.storage
    return SqliteStore(
        storage.path,
        synchronous=storage.synchronous,
        busy_timeout=storage.busy_timeout,
        # A request waits at most this long for a place in a commit before 503.
        write_queue_timeout=storage.busy_timeout + 1.0,
    )


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + ".lock")


class Relay:
    """One relay process. `start()` then `stop()`; tests drive it in-process."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        poll_interval: float = 1.0,
        on_attempt: Callable[[AttemptReport], None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.masker = Masker(config.secrets)
        self.store = open_store(config)
        self.targets: dict[str, Target] = {
            name: build_target(target) for name, target in config.targets.items()
        }
        self.scheduler = Scheduler(
            self.store,
            config,
            self.targets,
            self.clock,
            masker=self.masker,
            rng=rng,
            poll_interval=poll_interval,
            on_attempt=on_attempt or log_attempt,
        )
        self.ingress = Ingress(config, self.store, self.clock, on_accepted=self.scheduler.wake)
        self._lock = ProcessLock(lock_path(config.storage.path))
        self._runner: web.AppRunner | None = None
        self._scheduler_task: asyncio.Task[None] | None = None
        self._started: list[Callable[[], object]] = []

    @property
    def ingress_url(self) -> str:
        assert self._runner is not None
        host, port = self._runner.addresses[0][:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    async def start(self, *, scheduler: bool = True) -> None:
        """Open everything in order; a failure undoes what was opened."""
        try:
            self._lock.acquire()
            self._started.append(self._lock.release)
            await self.store.open()
            self._started.append(self.store.close)
            recovered = await self.store.recover_orphans(self.clock.now())
            if recovered:
                log.warning(
                    "%d deliveries were in flight when relay last stopped; retrying them", recovered
                )
            for target in self.targets.values():
                await target.start()
                self._started.append(target.close)
            if scheduler:
                self._scheduler_task = asyncio.create_task(self.scheduler.run(), name="scheduler")
            self._runner = web.AppRunner(
                self.ingress.application(), access_log=None, handle_signals=False
            )
            await self._runner.setup()
            listen = self.config.server.listen
            await web.TCPSite(self._runner, listen.host, listen.port, backlog=1024).start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop taking webhooks, finish what is in flight, close everything."""
        if self._runner is not None:
            # Stops listening and lets requests waiting on a commit get their answer.
            await self._runner.cleanup()
            self._runner = None
        await self.scheduler.stop(self.config.server.shutdown_timeout)
        if self._scheduler_task is not None:
            await self._scheduler_task
            self._scheduler_task = None
        while self._started:
            closer = self._started.pop()
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
    log.info(
        "relay ready: ingress on %s, %d routes, %d targets, database %s",
        relay.ingress_url,
        len(config.routes),
        len(config.targets),
        config.storage.path,
    )
    await stop.wait()
    log.info("stopping: finishing attempts in flight (up to %gs)", config.server.shutdown_timeout)
    await relay.stop()
    log.info("stopped")
    return 0
