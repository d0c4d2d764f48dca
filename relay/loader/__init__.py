"""Reading a config file whole: every route, target and source, each kind's
keys read by its module (relay.loader.registry lists them). Sits above the
kinds, which read their own keys with relay.config's primitives.

`load_config` reads what the daemon needs; `load_database_command_config` what the
database commands need (the database and the names), with no secret of a
target required.
"""

from __future__ import annotations

from relay.loader.database_commands import DatabaseCommandConfig, load_database_command_config
from relay.loader.load import load_config, parse_config

__all__ = ["DatabaseCommandConfig", "load_config", "load_database_command_config", "parse_config"]
