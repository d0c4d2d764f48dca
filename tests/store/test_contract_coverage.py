"""Every verb of every store role is exercised by the contract suite.

A verb added to a role in relay/store/base.py without a contract test fails
here, naming it: a second backend is only as right as the suite is complete.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from relay.store import base

ROLES = (
    base.Intake,
    base.Queue,
    base.Operations,
    base.Queries,
    base.Indexing,
    base.Health,
    base.Maintenance,
    base.Streaks,
    base.Rhythms,
    base.Store,
)


def verbs(role: type) -> set[str]:
    return {name for name in vars(role) if not name.startswith("_")} - {"mro"}


def used_in_contract_suite() -> set[str]:
    used: set[str] = set()
    here = Path(__file__).parent
    # store_backends.py opens and closes every store the suite uses.
    for path in [here.parent / "store_backends.py", *here.glob("test_contract*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "store"
            ):
                used.add(node.attr)
    return used


def test_every_verb_of_every_role_is_in_the_contract_suite() -> None:
    used = used_in_contract_suite()
    missing = {
        f"{role.__name__}.{verb}" for role in ROLES for verb in verbs(role) if verb not in used
    }
    assert not missing, f"verbs with no contract test: {sorted(missing)}"


def test_every_verb_belongs_to_exactly_one_role() -> None:
    seen: dict[str, str] = {}
    for role in ROLES[:-1]:
        for verb in verbs(role):
            assert verb not in seen, f"{verb} is in both {seen[verb]} and {role.__name__}"
            seen[verb] = role.__name__
    assert verbs(base.Store) == {"open", "close"}  # the union adds only the lifecycle


def test_the_store_protocol_is_the_union_of_the_roles() -> None:
    assert set(inspect.getmro(base.Store)[1 : len(ROLES)]) == set(ROLES[:-1])
