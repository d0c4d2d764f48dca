"""Configs that between them use every target type and source profile, so that
parsing them asks for every key the loader knows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from relay.loader import parse_config
from relay.loader.registry import source_kinds

TARGETS: dict[str, dict[str, Any]] = {
    "http": {
        "type": "http",
        "url": "https://crm.example/x",
        "sign": "whsec_c2VjcmV0",
        "follow_redirects": True,
        "redirect_hosts": ["crm2.example"],
        "proxy": "http://user:secret@proxy.example:3128",
        "tls_verify": False,
        "hold_when_down": True,
        "down_after": 3,
    },
    "file": {"type": "file", "path": "out.jsonl"},
    "smtp": {
        "type": "smtp",
        "host": "smtp.example",
        "from": "a@example.com",
        "to": ["b@example.com"],
        "username": "u",
        "password": "p",
    },
    "telegram": {"type": "telegram", "bot_token": "1:AA", "chat_id": 1},
}
SOURCE_OPTIONS: dict[str, dict[str, Any]] = {
    "tbank": {"password": "p"},
    "woocommerce": {"secret": "s"},
    "telegram": {"secret_token": "t"},
    "standard-webhooks": {"secret": "whsec_c2VjcmV0"},
    "hmac": {"header": "X-Sig", "secret": "s"},
}


def every_key() -> set[str]:
    """Every dotted key the loader asks for, with names and indexes generalised:
    targets.NAME.url, routes.NAME.targets[].when, retry.base..."""
    routes = {f"r_{source}": route_of(source) for source in source_kinds()}
    return asked_by(
        {
            "server": {},
            "storage": {},
            "admin": {},
            "log": {},
            "retry": {},
            "alerts": {"target": "http"},
            "targets": {name: {**table, "retry": {}} for name, table in TARGETS.items()},
            "routes": routes,
        }
    )


def route_of(source: str) -> dict[str, Any]:
    """A route of `source` that asks for every key a route may have."""
    return {
        "path": f"/{source}",
        "targets": [
            "http",
            {
                "target": "file",
                "when": "true",
                "retry": {"retries": 1},
                "order_by": "{{ json.id }}",
            },
        ],
        "source": source,
        "response": {"status": 200, "body": "ok"},
        "strip_fields": ["api_key"],
        **SOURCE_OPTIONS.get(source, {}),
    }


def source_keys(source: str) -> set[str]:
    """The keys a route asks for with this source: routes.NAME.secret..."""
    config = {"targets": {name: TARGETS[name] for name in ("http", "file")}}
    keys = asked_by({**config, "routes": {"r": route_of(source)}})
    return {key for key in keys if key.startswith("routes.NAME.")}


def target_keys(kind: str) -> set[str]:
    """The keys a target of this type asks for: targets.NAME.url..."""
    [table] = [table for table in TARGETS.values() if table["type"] == kind]
    route = {"path": "/x", "targets": ["t"]}
    keys = asked_by({"targets": {"t": table}, "routes": {"r": route}})
    return {key for key in keys if key.startswith("targets.NAME.")}


def asked_by(config: dict[str, Any]) -> set[str]:
    """The generalised keys parsing `config` asks for."""
    asked: set[str] = set()
    parse_config(config, {}, base=Path("/tmp"), asked_keys=asked)
    keys = set()
    for key in asked:
        key = re.sub(r"^targets\.[^.]+\.", "targets.NAME.", key)
        key = re.sub(r"^routes\.[^.]+\.targets\[\d+\]", "routes.NAME.targets[]", key)
        key = re.sub(r"^routes\.[^.]+\.", "routes.NAME.", key)
        key = re.sub(r"^(targets\.NAME|routes\.NAME\.targets\[\])\.retry\.", "retry.", key)
        key = re.sub(r"\[\d+\]$", "", key)
        if key.startswith(("targets.NAME.headers.", "targets.NAME.form.")):
            continue
        if "." not in key or re.fullmatch(r"(routes|targets)\.[^.]+", key):
            continue  # a table's own name, not a key in it
        keys.add(key)
    return keys
