"""The PostgreSQL store's health: this instance is alive and the database takes a durable write."""

from __future__ import annotations

from relay.store.postgres.connection import PostgresConnection


class PostgresHealth(PostgresConnection):
    async def heartbeat(self, now: float) -> None:
        """This instance is alive and the database takes a durable write."""
        if self._started_at is None:
            self._started_at = now
        async with self._connection() as connection:
            await connection.execute(
                "INSERT INTO instances (id, started_at, seen_at) VALUES ($1, $2, $3)"
                " ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at",
                self.instance_id,
                self._started_at,
                now,
            )

    def file_problem(self) -> str | None:
        return None  # no file: the server's own health is what heartbeat() checks
