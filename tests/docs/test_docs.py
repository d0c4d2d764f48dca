"""Docs that cannot drift: every config key, kind and command is documented, in
its one home (docs/reference.md), and what repeats it elsewhere is checked
against the code: the example config's keys and profiles, develop.md's lists
of a kind's fields, the listing's fields, the links between the pages."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relay.cli import parser
from relay.config import AdminConfig, ServerConfig
from relay.kinds.base import SourceKind, TargetKind
from relay.kinds.source import REJECT_REASONS
from relay.loader import parse_config
from relay.loader.registry import source_kinds, target_kinds
from relay.ops.glance import ROLES
from relay.ops.metrics import INGRESS_RESULTS, Metrics
from relay.ops.systemd import BACKLOG, LISTENERS

from activation import SocketUnit, service_sockets
from kitchen_sink import TARGETS, every_key, source_keys, target_keys

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
EXAMPLE = (ROOT / "relay.example.toml").read_text(encoding="utf-8")


def test_every_config_key_is_in_the_reference() -> None:
    keys = every_key()
    assert len(keys) > 60  # the kitchen sink really covers the loader
    missing = sorted(key for key in keys if f"`{key}`" not in REFERENCE)
    assert missing == []


def test_every_kind_is_in_the_kitchen_sink_and_the_reference() -> None:
    # Derived from the registries: a kind registered without its docs (or
    # without a table here, so that its keys are never asked for) fails, and
    # so does a section for a kind there is not. Sources in the registry's order.
    assert {table["type"] for table in TARGETS.values()} == set(target_kinds())
    types = re.findall(r'^### `type = "([^"]+)"`$', REFERENCE, re.MULTILINE)
    assert sorted(types) == sorted(target_kinds())
    sources = re.findall(r'^#### `source = "([^"]+)"`$', REFERENCE, re.MULTILINE)
    assert sources == list(source_kinds())
    # The key's own row names every type it takes.
    row = re.search(r"^\| `targets\.NAME\.type` \|.*$", REFERENCE, re.MULTILINE)
    assert row is not None
    assert sorted(re.findall(r'`"([a-z_-]+)"`', row.group(0))) == sorted(target_kinds())


def section(text: str, heading: str) -> str:
    """From `heading` (a whole line) to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    found = re.search(
        rf"^{re.escape(heading)}$\n.*?(?=^#{{1,{level}}} |\Z)", text, re.MULTILINE | re.DOTALL
    )
    assert found is not None, f"no {heading!r}"
    return found.group(0)


def own_keys(keys_of: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each kind's keys but those every kind has (a route's path, a target's
    rate): the last part of the dotted name."""
    common = set.intersection(*keys_of.values())
    return {
        kind: {key.rsplit(".", 1)[-1] for key in keys - common} for kind, keys in keys_of.items()
    }


def test_each_kinds_own_keys_are_in_its_own_reference_section() -> None:
    for kind, keys in own_keys({k: source_keys(k) for k in source_kinds()}).items():
        text = section(REFERENCE, f'#### `source = "{kind}"`')
        assert sorted(k for k in keys if f"`routes.NAME.{k}`" not in text) == [], kind
    for kind, keys in own_keys({k: target_keys(k) for k in target_kinds()}).items():
        text = section(REFERENCE, f'### `type = "{kind}"`')
        missing = [k for k in keys if f"`targets.NAME.{k}`" not in text and f"`{k}`" not in text]
        assert sorted(missing) == [], kind


def test_every_config_key_is_in_the_example_config() -> None:
    missing = sorted(
        key
        for key in every_key()
        if not re.search(
            rf"(^|[\s#{{,]){re.escape(key.rsplit('.', 1)[-1])}\s*=", EXAMPLE, re.MULTILINE
        )
    )
    assert missing == []


def example_part(start: str, end: str) -> str:
    """relay.example.toml from the line matching `start` to the next line
    matching `end` (or its end)."""
    lines = EXAMPLE.splitlines()
    [first] = [i for i, line in enumerate(lines) if re.match(start, line)]
    rest = [i for i, line in enumerate(lines) if i > first and re.match(end, line)]
    return "\n".join(lines[first : rest[0] if rest else len(lines)])


def test_the_example_lists_each_source_with_its_own_keys() -> None:
    # One line a profile at the end, each with its keys; "generic" is the
    # route's own source line, its keys after it.
    profiles = re.findall(r'^#\s+source = "([^"]+)"', EXAMPLE, re.MULTILINE)
    assert ["generic", *profiles] == list(source_kinds())
    for kind, keys in own_keys({k: source_keys(k) for k in source_kinds()}).items():
        if kind == "generic":
            part = example_part(r'source = "generic"', r"# Source profiles")
        else:
            part = example_part(rf'#\s+source = "{re.escape(kind)}"', r"#\s+source = ")
        assert sorted(k for k in keys if not re.search(rf"\b{k}\b", part)) == [], kind


def test_the_example_has_a_table_of_each_target_type_with_its_own_keys() -> None:
    for kind, keys in own_keys({k: target_keys(k) for k in target_kinds()}).items():
        part = example_part(rf'#?\s*type = "{re.escape(kind)}"', r"#?\s*\[")
        assert sorted(k for k in keys if not re.search(rf"\b{k}\b", part)) == [], kind


def commands() -> dict[str, argparse.ArgumentParser]:
    subparsers = next(
        action for action in parser()._actions if isinstance(action, argparse._SubParsersAction)
    )
    return dict(subparsers.choices)


def test_every_command_and_option_is_in_the_reference() -> None:
    found = commands()
    assert {
        "serve",
        "check",
        "events",
        "show",
        "retry",
        "requeue",
        "stats",
        "purge",
        "backup",
        "init",
        "render",
        "pause",
        "resume",
        "rejections",
    } <= set(found)
    for name, command in found.items():
        section = re.search(
            rf"^### [^\n]*`relay {name}\b[^\n]*\n.*?(?=^### |\Z)",
            REFERENCE,
            re.MULTILINE | re.DOTALL,
        )
        assert section is not None, f"relay {name} has no section"
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    if option == "--config":
                        continue  # documented once, for every command
                    assert option in section.group(0), f"relay {name} {option} undocumented"


DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_the_readme_is_a_readme() -> None:
    """What relay is, a quick start, where to read on: the tables of sources,
    targets, keys and commands are the reference's alone (they drifted apart
    when the README had its own)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"^\|", readme, re.MULTILINE), "a table in the README"
    for path in [*DOCS, ROOT / "bench" / "RESULTS.md"]:
        assert f"]({path.relative_to(ROOT)})" in readme, f"the README does not link {path.name}"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_links_between_the_docs_lead_somewhere() -> None:
    # The README's sections moved to the reference, the benchmarks to
    # bench/RESULTS.md: a link to where a fact was must fail, not 404.
    broken = []
    for page in [ROOT / "README.md", *DOCS, ROOT / "bench" / "RESULTS.md"]:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == [], "\n".join(broken)


def test_every_kind_the_docs_configure_is_one_relay_knows() -> None:
    # A sender or target type renamed or gone must not live on in a guide.
    for page in [ROOT / "README.md", *DOCS, ROOT / "relay.example.toml"]:
        text = page.read_text(encoding="utf-8")
        named = set(re.findall(r'\bsource = "([^"<.][^"]*)"', text))
        assert named <= set(source_kinds()), (page.name, named - set(source_kinds()))
        types = set(re.findall(r'\btype = "([^"<.][^"]*)"', text))
        assert types <= set(target_kinds()), (page.name, types - set(target_kinds()))


def test_the_develop_guide_names_every_field_of_a_kind() -> None:
    # develop.md's "Adding a target type" and "Adding a source" list what a
    # KIND declares: dedup_window was missing from it (issue 52).
    develop = (ROOT / "docs" / "develop.md").read_text(encoding="utf-8")
    for kind, heading in (
        (TargetKind, "## Adding a target type"),
        (SourceKind, "## Adding a source"),
    ):
        step = section(develop, heading)
        call = re.search(rf"`KIND = {kind.__name__}\((.*?)\)`", step, re.DOTALL)
        assert call is not None, heading
        fields = dataclasses.fields(kind)
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        required -= {f.name for f in fields if f.default_factory is not dataclasses.MISSING}
        assert set(re.findall(r"(\w+)=\.\.\.", call.group(1))) == required, heading
        named = set(re.findall(r"`(\w+)`", step)) | required
        assert sorted({f.name for f in fields} - named) == [], heading


def test_the_fields_the_reference_says_a_listing_shows_are_the_glances() -> None:
    # `relay events`' WHO column: every field the reference names for a role
    # is one relay.ops.glance reads for it, and every role is named.
    events = section(REFERENCE, "### `relay events`")
    said = re.search(r"read\s+from the body — (.*?) — each", events, re.DOTALL)
    assert said is not None
    roles = dict(ROLES)
    words = {"name": "a name", "phone": "a phone", "email": "an e-mail", "order": "an order",
             "amount": "an amount"}  # fmt: skip
    assert set(words) == set(roles)
    for role, word in words.items():
        listed = re.search(rf"{word}(?: \(([^()]*)\))?", said.group(1).replace("\n", " "))
        assert listed is not None, word
        for field in re.findall(r"`([^`]+)`", listed.group(1) or ""):
            name = re.sub(r"[\W_]+", "", field.rsplit(".", 1)[-1].lower())
            # A last name is read beside its first name (glance.who), not on its own.
            known = roles[role] | ({"lastname"} if role == "name" else set())
            assert name in known, (role, field)


UNITS = ("relay.service", "relay.socket", "relay-admin.socket")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_systemd_units_verify(tmp_path: Path) -> None:
    # The relay beside this interpreter: PATH may not include the venv's bin.
    relay = shutil.which("relay", path=str(Path(sys.executable).parent))
    assert relay is not None
    # verify checks that ExecStart exists: point it at this environment's relay.
    for name in UNITS:
        text = (ROOT / "systemd" / name).read_text()
        (tmp_path / name).write_text(text.replace("/usr/local/bin/relay", relay))
    result = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / name) for name in UNITS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    unit = (ROOT / "systemd" / "relay.service").read_text()
    for directive in (
        "Type=notify",
        "WatchdogSec=",
        "ExecReload=",
        "Restart=on-failure",
        "StateDirectory=relay",
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "RestrictAddressFamilies=",
        "SystemCallFilter=@system-service",
        "CapabilityBoundingSet=",
        "EnvironmentFile=",
        "LoadCredential=",
        "TimeoutStopSec=",
        # relay.pyz unpacks into $SHIV_ROOT: under the unit HOME=/ is read-only.
        "CacheDirectory=relay",
        "Environment=SHIV_ROOT=/var/cache/relay",
        # Socket activation: the listeners are systemd's, and stopping a socket stops relay.
        "Sockets=relay.socket relay-admin.socket",
        "Requires=relay.socket relay-admin.socket",
    ):
        assert directive in unit
    # A stop takes server.shutdown_timeout at most, then closes the database.
    stop = int(re.search(r"^TimeoutStopSec=(\d+)s", unit, re.MULTILINE).group(1))
    assert stop >= ServerConfig().shutdown_timeout + 10


def test_the_socket_units_are_the_ones_relay_takes() -> None:
    """Each socket unit names its descriptor as relay takes it, queues as many
    connections as relay's own listen() asks for (it calls listen() again on
    the socket it is given), and listens where the config's defaults do."""
    sockets = [SocketUnit.read(ROOT / "systemd" / name) for name in UNITS[1:]]
    assert [unit.fd_name for unit in sockets] == list(LISTENERS)
    assert all(unit.backlog == BACKLOG for unit in sockets)
    assert [unit.listen for unit in sockets] == [
        str(ServerConfig().listen),
        str(AdminConfig().listen),
    ]
    assert [unit.name for unit in service_sockets()] == list(UNITS[1:])


@pytest.mark.parametrize("name", UNITS)
def test_every_directive_is_explained(name: str) -> None:
    lines = (ROOT / "systemd" / name).read_text().splitlines()
    for index, line in enumerate(lines):
        if "=" in line and not line.startswith(("#", "[")) and line.strip():
            before = lines[max(0, index - 6) : index]
            assert any(previous.startswith("#") for previous in before), f"unexplained: {line}"


def test_every_ingest_result_and_rejection_reason_is_documented_and_exported_at_0() -> None:
    # operate.md said all were exported from the start; 4 of 12 results were,
    # and no rejection reason until the first rejection.
    operate = (ROOT / "docs" / "operate.md").read_text(encoding="utf-8")
    results = re.search(
        r"\| `relay_events_received_total` \| counter \| `route`, `result` \(([^)]*)\)", operate
    )
    assert results is not None
    listed = re.findall(r"\b[a-z_]+\b", results.group(1).split(";")[0])
    assert listed == list(INGRESS_RESULTS)
    reasons = re.search(
        r"\| `relay_rejected_total` \| counter \| `route`, `reason` \(([^)]*)\)", operate
    )
    assert reasons is not None
    assert [r.strip() for r in reasons.group(1).split(",")] == list(REJECT_REASONS)
    metrics = Metrics()
    config = {
        "targets": {"crm": {"type": "file", "path": "crm.jsonl"}},
        "routes": {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
    }
    metrics.configure(parse_config(config, {}, base=ROOT))
    text = metrics.render().decode()
    for result in INGRESS_RESULTS:
        assert f'result="{result}"' in text
    for reason in REJECT_REASONS:
        assert f'relay_rejected_total{{reason="{reason}"' in text


def test_every_rejection_a_source_gives_is_in_the_vocabulary() -> None:
    said = set()
    for path in (ROOT / "relay" / "sources").glob("*.py"):
        said |= set(re.findall(r'Reject\(\s*"([a-z_]+)"', path.read_text(encoding="utf-8")))
    assert said
    assert said <= set(REJECT_REASONS), said - set(REJECT_REASONS)
