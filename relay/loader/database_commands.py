"""What the database commands need: the database, and the names in the config.

`relay events`, `retry`, `pause`... work on the database. They must not
refuse to run because a target's secret (a CRM token, a bot token) lives
only in the service's environment: here, references that cannot be resolved
outside [storage] are left as written, and targets are known by name only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import MappingProxyType

from relay.config.model import AlertsConfig, StorageConfig
from relay.config.reader import ConfigError, Section, substitute
from relay.core.localtime import Zone, zone_named
from relay.core.secrets import Masker
from relay.loader.load import masked_error, parse_storage, parse_timezone, read_toml
from relay.loader.registry import source_kinds, target_kinds


@dataclass(frozen=True)
class DatabaseCommandConfig:
    storage: StorageConfig
    targets: frozenset[str]
    # Each route's dedup_window (None: the storage retention applies).
    dedup_windows: Mapping[str, float | None]
    secrets: frozenset[str]
    source: Path
    timezone: str | None = None
    # [alerts] delivery_failing_after: what `--failing` takes (keeps failing).
    delivery_failing_after: int = AlertsConfig.delivery_failing_after

    @property
    def routes(self) -> frozenset[str]:
        return frozenset(self.dedup_windows)

    @cached_property
    def zone(self) -> Zone:
        return zone_named(self.timezone)

    @cached_property
    def masker(self) -> Masker:
        """The masker of these secrets (as `Config.masker`: built once)."""
        return Masker(self.secrets)


def load_database_command_config(path: Path, environ: Mapping[str, str]) -> DatabaseCommandConfig:
    data = read_toml(path)
    base = path.resolve().parent
    secrets: set[str] = set()
    storage_raw = data.get("storage", {})
    if isinstance(storage_raw, dict):
        # relay serve's name in the cluster: a command leases nothing, and one
        # relay.toml on every host names each from its own environment.
        storage_raw = {k: v for k, v in storage_raw.items() if k != "instance_id"}
    storage_table = substitute(storage_raw, environ, "storage", secrets)
    rest = substitute(
        {k: v for k, v in data.items() if k != "storage"}, environ, "", secrets, strict=False
    )
    try:
        storage = parse_storage(Section(storage_table, "storage"), base)
        routes = rest.get("routes", {}) if isinstance(rest.get("routes"), dict) else {}
        windows: dict[str, float | None] = {}
        for name, table in routes.items():
            if isinstance(table, dict):
                windows[name] = Section(table, f"routes.{name}").duration("dedup_window", None)
        alerts = rest.get("alerts")
        failing_after = (
            Section(alerts, "alerts").integer(
                "delivery_failing_after", AlertsConfig.delivery_failing_after, minimum=1
            )
            if isinstance(alerts, dict)
            else AlertsConfig.delivery_failing_after
        )
        admin = rest.get("admin")
        timezone = (
            parse_timezone(Section({"timezone": admin.get("timezone")}, "admin"))
            if isinstance(admin, dict) and admin.get("timezone") is not None
            else None
        )
    except ConfigError as error:
        raise masked_error(error, secrets) from None
    targets = rest.get("targets", {})
    return DatabaseCommandConfig(
        storage=storage,
        targets=frozenset(targets if isinstance(targets, dict) else ()),
        dedup_windows=MappingProxyType(windows),
        secrets=frozenset(secrets | _inline_credentials(rest)),
        source=path.resolve(),
        timezone=timezone,
        delivery_failing_after=failing_after,
    )


def _inline_credentials(tree: dict[str, object]) -> set[str]:
    """Credentials written in the file itself, to mask them all the same."""
    found: set[str] = set()
    admin = tree.get("admin")
    if isinstance(admin, dict) and isinstance(admin.get("token"), str):
        found.add(admin["token"])
    # Each table's credential keys are its own kind's (a target's `type`, a
    # route's `source`): a key that is a secret for one kind (ntfy's `topic`)
    # is plain text for another.
    for group, registry, field, default in (
        ("targets", target_kinds(), "type", None),
        ("routes", source_kinds(), "source", "generic"),
    ):
        tables = tree.get(group)
        for table in tables.values() if isinstance(tables, dict) else ():
            if not isinstance(table, dict):
                continue
            kind = registry.get(str(table.get(field, default)))
            for key in kind.secret_keys if kind is not None else ():
                value = table.get(key)
                values = value if isinstance(value, list) else [value]
                found.update(v for v in values if isinstance(v, str))
    return found
