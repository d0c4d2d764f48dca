"""docs/deploy.md, followed literally, gives a service that takes a Tilda lead.

The test reads the guide's shell blocks (steps 1 to 3) and runs them, line
by line, as root — as the guide's reader does with sudo — for both installs
(a virtual environment, and the single file). Where a container differs from
a VPS, the test says so here, and only there:

* The machine is not ours: every system path the guide names (/etc/relay,
  /opt/relay, /usr/local/bin, /var/lib/relay...) lives under a temporary
  prefix, in the commands and in the installed unit alike.
* There is no systemd to start the unit: `systemctl` is emulated (`Systemd`)
  as far as the guides use it. Starting the service listens on its socket
  units' sockets (as installed, `Sockets=`), held until they are stopped,
  and runs the installed unit's ExecStart= on them the way systemd would
  (tests/activation.py: LISTEN_FDS from descriptor 3) — as an
  unprivileged uid (the dynamic user) with no capabilities, HOME=/, its
  EnvironmentFile= read by systemd's rules, Environment=, the state and
  cache directories it owns, LoadCredential= files in a directory only it
  can read ($CREDENTIALS_DIRECTORY), UMask=, and, in a mount namespace, the
  whole file system read-only except those directories (ProtectSystem=
  strict) and a private /tmp (PrivateTmp=). A stop that leaves a socket
  listening while the service is stopped fails the test: the next webhook
  would start relay again, in the middle of whatever the guide does then.
* `apt install` checks that the package is there (CI installs it).
* The CLI's default config, /etc/relay/relay.toml, is the prefix's
  (RELAY_CONFIG in the shell's environment).
* `editor` on the env file writes the guide's own example with this test's
  values; ports 8080/8081 may be taken on a shared machine, so the config's
  and the socket units' listeners move to free ports.

Then a Tilda lead (the fields Tilda's forms send) goes in and must reach the
CRM as a complete lead; the CLI reads it back as root, refuses another user
in one line. Then docs/operate.md's daily commands run as its reader runs
them (`sudo relay ...`, no flags): what is stuck, the admin API with the one
token, a config check and reload, an env change and restart, a backup and its
restore — after which the service starts on the restored file, owned by its
user —, and the upgrade of the same install (its variant), to this
checkout's version installed beside it. Where operate.md names an example
(event 1842, yesterday's backup), the test uses this run's (event 1, today's
backup); systemctl and journalctl are emulated as for deploy.md. Finally the
service stops cleanly.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

from relay.cli.envfile import parse_env_file

from activation import SocketUnit, SocketUnits
from helpers import Sink, free_port
from unit.test_watchdog import NotifySocket

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the guide as root, the service as a uid"),
]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deploy.md"
# What systemd's DynamicUser= allocates from (61184-65519); not a user here.
SERVICE_UID = 61234
OTHER_UID = 61235
# Debian 12's systemd gives services this PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_PATHS = (
    "/etc/systemd/system",
    "/etc/relay",
    "/opt/relay",
    "/usr/local/bin",
    "/usr/share/doc/relay",
    "/var/lib/relay",
    "/var/cache/relay",
    "/var/backups",
)
# A system path starts a word (after "=", ":", "-", a space, "file://") and is
# whole; inside the prefix it follows a letter of the prefix's name.
_SYSTEM_PATH_RE = re.compile(
    r"(?<!\w)(" + "|".join(re.escape(p) for p in SYSTEM_PATHS) + r""")(?=[/\s"':|)]|$)"""
)

# The secrets in the guide's env file, as this test sets them.
TILDA_API_KEY = "tilda-key-7f3a9c21"


@dataclass
class Block:
    section: str  # "## 2. Write the config"
    subsection: str  # "### One file (relay.pyz)", or ""
    language: str
    text: str


def guide_blocks() -> list[Block]:
    blocks: list[Block] = []
    section = subsection = ""
    lines = iter(GUIDE.read_text(encoding="utf-8").splitlines())
    for line in lines:
        if line.startswith("## "):
            section, subsection = line, ""
        elif line.startswith("### "):
            subsection = line
        elif line.startswith("```"):
            body = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                body.append(inner)
            blocks.append(Block(section, subsection, line[3:].strip(), "\n".join(body)))
    return blocks


def install_steps(variant: str) -> list[Block]:
    """The guide's shell blocks for steps 1-3, with the install `variant` picked."""
    other = "### One file" if variant == "venv" else "### A virtual environment"
    wanted = ("## 1.", "## 2.", "## 3.")
    return [
        block
        for block in guide_blocks()
        if block.section.startswith(wanted)
        and block.language in ("sh", "env")
        and not block.subsection.startswith(other)
    ]


def commands(block: Block) -> Iterator[str]:
    """One command a line; a trailing backslash joins lines, as in a shell."""
    pending = ""
    for line in block.text.splitlines():
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            yield command


@dataclass
class Machine:
    """The prefix that stands for the VPS's file system, and what runs there."""

    prefix: Path
    checkout: Path
    ingress_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)

    def path(self, system_path: str) -> Path:
        return Path(self.rewrite(system_path))

    def rewrite(self, text: str) -> str:
        """System paths into the prefix; idempotent (a prefixed path is left alone)."""
        return _SYSTEM_PATH_RE.sub(lambda m: f"{self.prefix}{m.group(1)}", text)

    def shell_env(self) -> dict[str, str]:
        env = {
            "PATH": f"{self.prefix}/usr/local/bin:{SYSTEM_PATH}",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            # relay.pyz run from this shell unpacks here, not into root's real ~/.shiv.
            "SHIV_ROOT": str(self.prefix / "root-shiv"),
            # The CLI's default config path, in the prefix.
            "RELAY_CONFIG": self.rewrite("/etc/relay/relay.toml"),
        }
        # The machine's own package-registry settings, as `sudo pip` would see them.
        env.update(
            {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.endswith("_proxy")}
        )
        return env

    def run(self, command: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=self.checkout,
            env=self.shell_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            **kwargs,  # type: ignore[arg-type]
        )


def without_sudo(command: str) -> str:
    """The reader runs each command with sudo; the test is root already."""
    return re.sub(r"(^|\|\s*|\$\()sudo\s+", r"\1", command)


def env_file_text(example: str, crm_url: str) -> str:
    """The guide's env file, with this test's values in the same lines."""
    values = {
        "TILDA_API_KEY": TILDA_API_KEY,
        "BITRIX_WEBHOOK_URL": crm_url,
        "TELEGRAM_BOT_TOKEN": "123456:AAtest-bot-token",
        "TELEGRAM_CHAT_ID": "-1001234567890",
        # Where nothing listens: mail is retried, and 127.0.0.1 must not be
        # masked as a secret in the log.
        "SMTP_HOST": "127.0.0.1",
        "SMTP_USER": "relay@example.com",
        "SMTP_PASSWORD": "smtp-password-5e1",
        "MAIL_FROM": "relay@example.com",
        "MAIL_TO": "manager@example.com",
    }
    lines = []
    for line in example.splitlines():
        name, sep, _ = line.partition("=")
        if sep and not line.startswith("#") and name in values:
            line = f"{name}={values.pop(name)}"
        lines.append(line)
    assert values == {}, f"the guide's env file lacks {sorted(values)}"
    return "\n".join(lines) + "\n"


# The service, as systemd would run the installed unit.


def read_unit(path: Path) -> dict[str, list[str]]:
    """[Service] directives, each with all its values (directives may repeat)."""
    directives: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            name, _, value = line.partition("=")
            directives.setdefault(name, []).append(value)
    return directives


@dataclass
class Service:
    process: subprocess.Popen[bytes]
    log: Path
    notify: NotifySocket
    state: Path
    cache: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        finally:
            self.notify.close()


def start_service(
    machine: Machine, unit_path: Path, sockets: SocketUnits, *, fresh: bool = False
) -> Service:
    """The unit started as systemd starts it, on its sockets; `fresh`: once
    more, after a stop."""
    unit = read_unit(unit_path)
    assert unit["DynamicUser"] == ["yes"]
    prefix = machine.prefix
    uid = SERVICE_UID

    def owned_directory(path: Path, mode: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, uid, uid)
        path.chmod(int(mode, 8))
        return path

    [state_name] = unit["StateDirectory"]
    [cache_name] = unit["CacheDirectory"]
    [config_name] = unit["ConfigurationDirectory"]
    state = owned_directory(prefix / "var/lib" / state_name, unit["StateDirectoryMode"][0])
    cache = owned_directory(prefix / "var/cache" / cache_name, unit["CacheDirectoryMode"][0])
    # LoadCredential=: copies in a directory the service alone may read.
    credentials = prefix / "run/credentials/relay.service"
    if fresh:  # systemd makes them anew at each start
        shutil.rmtree(credentials)
        shutil.rmtree(prefix / "private-tmp")
    credentials.mkdir(parents=True)
    for item in unit.get("LoadCredential", []):
        name, _, source = item.partition(":")
        copy = credentials / name
        shutil.copyfile(source, copy)
        os.chown(copy, uid, uid)
        copy.chmod(0o400)
    os.chown(credentials, uid, uid)
    credentials.chmod(0o500)

    notify = NotifySocket(abstract=True)
    environment = {
        "PATH": SYSTEM_PATH,
        "LANG": "C.UTF-8",
        "HOME": "/",  # what DynamicUser= gives
        "USER": "relay",
        "LOGNAME": "relay",
        "SHELL": "/usr/sbin/nologin",
        "STATE_DIRECTORY": str(state),
        "CACHE_DIRECTORY": str(cache),
        "CONFIGURATION_DIRECTORY": str(prefix / "etc" / config_name),
        "CREDENTIALS_DIRECTORY": str(credentials),
        "NOTIFY_SOCKET": notify.path,
        "WATCHDOG_USEC": str(int(unit["WatchdogSec"][0].rstrip("s")) * 1_000_000),
    }
    for item in unit.get("Environment", []):
        name, _, value = item.partition("=")
        environment[name] = value
    for item in unit.get("EnvironmentFile", []):
        env_file = Path(item.removeprefix("-"))
        if env_file.exists() or not item.startswith("-"):
            environment.update(parse_env_file(env_file.read_text(encoding="utf-8")))

    private_tmp = prefix / "private-tmp"
    private_tmp.mkdir(mode=0o1777)
    private_tmp.chmod(0o1777)
    [exec_start] = unit["ExecStart"]
    [umask] = unit["UMask"]
    writable = [state, cache, credentials]
    sandbox = "\n".join(
        [
            "set -eu",
            *(f"mount --bind {shlex.quote(str(p))} {shlex.quote(str(p))}" for p in writable),
            f"mount --bind {shlex.quote(str(private_tmp))} /tmp",
            "mount -o remount,bind,ro /",
            f"umask {umask}",
            f'exec setpriv --reuid={uid} --regid={uid} --clear-groups --no-new-privs "$@"',
        ]
    )
    log = prefix / "service.log"
    # Every step execs the next, so LISTEN_PID (the launcher's) is relay's.
    activation, fds = sockets.launcher()
    with log.open("ab") as output:
        process = subprocess.Popen(
            [
                *activation,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                sandbox,
                "relay.service",
                *shlex.split(exec_start),
            ],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
        )
    return Service(process, log, notify, state, cache)


@dataclass
class Systemd:
    """`systemctl`, as far as the guides use it, for the installed unit and
    the socket units it names in Sockets= (in the prefix, as installed)."""

    machine: Machine
    service: Service | None = None
    sockets: SocketUnits | None = None

    @property
    def unit_path(self) -> Path:
        return self.machine.path("/etc/systemd/system/relay.service")

    async def run(self, command: str) -> None:
        verb, *units = command.split()[1:]
        if verb == "daemon-reload":
            return
        if verb == "enable":
            assert units[0] == "--now", command
            verb, units = "start", units[1:]
        names = {unit if "." in unit else f"{unit}.service" for unit in units}
        service = self.service
        if verb == "status":
            assert service is not None
            ready = next(m for _, m in service.notify.messages if "READY=1" in m)
            assert "STATUS=pending 0, dead 0" in ready, ready
            return
        if verb == "reload":
            assert service is not None
            assert names == {"relay.service"}
            seen = len(service.notify.messages)
            service.process.send_signal(signal.SIGHUP)
            await asyncio.to_thread(_wait_message, service, "READY=1", seen)
            return
        assert verb in ("start", "stop", "restart"), command
        if verb in ("stop", "restart") and "relay.service" in names and service is not None:
            assert await asyncio.to_thread(service.stop) == 0
            self.service = None
        if verb == "stop":
            if self.sockets is not None and {u.name for u in self.sockets.units} <= names:
                self.sockets.close()
                self.sockets = None
            assert self.sockets is None or self.service is not None, (
                f"{command}: relay is stopped while its sockets listen: the next"
                " webhook would start it again (stop relay.socket relay-admin.socket too)"
            )
            return
        if self.sockets is None:  # the service's Sockets=, started with it (Wants=, Requires=)
            self.sockets = SocketUnits(
                [SocketUnit.read(self.unit_path.parent / name) for name in self._socket_names()],
                as_written=True,
            ).listen()
        if "relay.service" in names:
            fresh = (self.machine.prefix / "run/credentials/relay.service").exists()
            started = start_service(self.machine, self.unit_path, self.sockets, fresh=fresh)
            self.service = started
            await asyncio.to_thread(wait_ready, started)

    def _socket_names(self) -> list[str]:
        return read_unit(self.unit_path)["Sockets"][-1].split()

    def close(self) -> None:
        if self.service is not None and self.service.process.poll() is None:
            self.service.process.kill()
            self.service.process.wait()
        if self.sockets is not None:
            self.sockets.close()


def wait_ready(service: Service, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, message in service.notify.messages:
            if "READY=1" in message:
                return message
        if service.process.poll() is not None:
            raise AssertionError(
                f"relay exited {service.process.returncode}:\n{service.log_text()}"
            )
        time.sleep(0.05)
    raise AssertionError(f"relay never said READY=1:\n{service.log_text()}")


def as_user(uid: int, command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# The test


@pytest.fixture
def machine() -> Iterator[Machine]:
    # Not under /tmp: the service gets a private /tmp, and the dynamic user
    # must reach the installed files, so every folder on the way is 755.
    prefix = Path(tempfile.mkdtemp(prefix="relay-deploy-", dir="/var/tmp"))
    prefix.chmod(0o755)
    for folder in (
        "usr/local/bin",
        "etc/systemd/system",
        "opt",
        "var/lib",
        "var/cache",
        "var/backups",
    ):
        (prefix / folder).mkdir(parents=True)
    checkout = prefix / "checkout"
    shutil.copytree(
        ROOT,
        checkout,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "__pycache__",
            "*.egg-info",
            "dist",
            "build",
            "test-artifacts",
            ".mypy_cache",
            ".ruff_cache",
            ".pytest_cache",
            ".hypothesis",
            "results",
            "relay.db*",
        ),
    )
    try:
        yield Machine(prefix, checkout)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def test_the_guide_parses_into_runnable_steps() -> None:
    for variant in ("venv", "single-file"):
        steps = install_steps(variant)
        text = "\n".join(block.text for block in steps)
        assert "relay init /etc/relay/relay.toml" in text
        assert "systemctl enable --now relay" in text
        assert ("build-single-file" in text) == (variant == "single-file")
    assert {b.section for b in operate_blocks()} == set(OPERATE_SECTIONS)
    env_blocks = [b for b in guide_blocks() if b.language == "env"]
    assert len(env_blocks) == 1
    # systemd keeps an inline comment as part of the value: the guide has none.
    for line in env_blocks[0].text.splitlines():
        if not line.startswith("#"):
            assert "#" not in line, line
            name, _, value = line.partition("=")
            assert parse_env_file(line) == {name: value}


@pytest.mark.parametrize("variant", ["venv", "single-file"])
async def test_following_the_guide_gives_a_service_that_takes_a_lead(
    variant: str, machine: Machine, aiohttp_server: AiohttpServer
) -> None:
    crm = Sink(script=[200])
    crm_server = await aiohttp_server(crm.app())
    crm_url = str(crm_server.make_url("/rest/1/abc123def456")).rstrip("/")
    env_example = next(b.text for b in guide_blocks() if b.language == "env")
    unit_path = machine.path("/etc/systemd/system/relay.service")
    config_path = machine.path("/etc/relay/relay.toml")
    systemd = Systemd(machine)
    try:
        for block in install_steps(variant):
            if block.language == "env":
                continue  # written by `editor` below
            for command in commands(block):
                await _follow(machine, command, env_example, crm_url, systemd)
                _installed_units(machine)
        service = systemd.service
        assert service is not None, "the guide never started the service"
        ingress = f"127.0.0.1:{machine.ingress_port}"
        assert f"listeners from systemd (socket activation): ingress on {ingress}" in (
            service.log_text()
        )

        # What the guide's steps left on disk.
        mode = lambda p: oct(p.stat().st_mode & 0o777)  # noqa: E731
        assert mode(config_path) == "0o644"
        assert mode(machine.path("/etc/relay/relay.env")) == "0o600"
        assert mode(machine.path("/etc/relay/credentials/relay_admin_token")) == "0o600"
        assert mode(machine.path("/var/backups/relay.db")) == "0o600"
        for unit in ("relay.service", "relay.socket", "relay-admin.socket"):
            for doc in read_unit_documentation(unit_path.parent / unit):
                assert doc.exists(), f"{unit}'s Documentation= names {doc}, not installed"

        # A lead as Tilda's forms send it (tests/fixtures/tilda), with the API
        # key in its field.
        lead = (ROOT / "tests/fixtures/tilda/lead-default-fields.txt").read_text().strip()
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"http://127.0.0.1:{machine.ingress_port}/hooks/tilda",
                data=f"{lead}&api_key={TILDA_API_KEY}",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            ) as response,
        ):
            assert response.status == 200, await response.text()
        await crm.wait_for(1, timeout=30)
        arrived = urllib.parse.parse_qs(crm.requests[0].body.decode())
        assert crm.requests[0].path == "/rest/1/abc123def456/crm.lead.add.json"
        assert arrived["fields[NAME]"] == ["Анна Петрова"]
        assert arrived["fields[PHONE][0][VALUE]"] == ["+7 (999) 000-00-01"]
        assert arrived["fields[EMAIL][0][VALUE]"] == ["anna@example.com"]
        assert arrived["fields[TITLE]"] == ["Lead from the site: Анна Петрова"]

        # The operator reads it back as root, without the service's environment.
        shell = machine.shell_env()
        config = str(config_path)
        shown = await asyncio.to_thread(machine.run, f"relay show 1 --config {shlex.quote(config)}")
        assert shown.returncode == 0, shown.stderr
        assert "crm" in shown.stdout
        assert TILDA_API_KEY not in shown.stdout
        # Another user (with a home of their own): one line that says what to do.
        home = machine.prefix / "home-other"
        home.mkdir()
        os.chown(home, OTHER_UID, OTHER_UID)
        other_env = {**shell, "HOME": str(home)}
        del other_env["SHIV_ROOT"]
        denied = await asyncio.to_thread(
            as_user, OTHER_UID, ["relay", "events", "--config", config], other_env
        )
        assert denied.returncode != 0
        assert "Traceback" not in denied.stderr
        assert denied.stderr.count("\n") == 1, denied.stderr
        assert "sudo relay events" in denied.stderr

        # The files the service made are its own.
        database = service.state / "relay.db"
        assert database.stat().st_uid == SERVICE_UID
        assert mode(database) == "0o600"

        await _operate(machine, systemd, variant)
        service = systemd.service
        assert service is not None
        assert database.stat().st_uid == SERVICE_UID  # restored, and still the service's
        shown = await asyncio.to_thread(machine.run, "relay show 1")
        assert shown.returncode == 0, shown.stderr
        if variant == "single-file":
            assert any(service.cache.iterdir()), "relay.pyz did not unpack into SHIV_ROOT"
        log = service.log_text()
        assert f"ingress on http://127.0.0.1:{machine.ingress_port}" in log
        assert "Traceback" not in log
        assert await asyncio.to_thread(service.stop) == 0
    finally:
        systemd.close()


OPERATE = ROOT / "docs" / "operate.md"
OPERATE_SECTIONS = (
    "## What is stuck, what is dead",
    "## Changing the config",
    "## Backups",
    "## Upgrades",
    "## The admin API and metrics",
)


def operate_blocks(variant: str = "venv") -> list[Block]:
    """operate.md's shell blocks in OPERATE_SECTIONS; of Upgrades, the install `variant`'s."""
    other = "### One file" if variant == "venv" else "### A virtual environment"
    blocks: list[Block] = []
    section = subsection = ""
    lines = iter(OPERATE.read_text(encoding="utf-8").splitlines())
    for line in lines:
        if line.startswith("## "):
            section, subsection = line, ""
        elif line.startswith("### "):
            subsection = line
        elif line.startswith("```"):
            body = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                body.append(inner)
            if (
                section in OPERATE_SECTIONS
                and line[3:].strip() == "sh"
                and not subsection.startswith(other)
            ):
                blocks.append(Block(section, subsection, "sh", "\n".join(body)))
    return blocks


async def _operate(machine: Machine, systemd: Systemd, variant: str) -> None:
    """docs/operate.md's blocks, line by line as root; systemctl emulated."""
    today = time.strftime("%Y-%m-%d")
    for block in operate_blocks(variant):
        if block.section == "## The admin API and metrics":
            # One script: its first line sets the token the next ones use.
            script = machine.rewrite(without_sudo(block.text)).replace(
                "127.0.0.1:8081", f"127.0.0.1:{machine.admin_port}"
            )
            done = await asyncio.to_thread(machine.run, script)
            assert done.returncode == 0, f"{block.text}\n{done.stdout}\n{done.stderr}"
            assert '"dead"' in done.stdout  # /api/v1/stats, with the one admin token
            assert "relay_deliveries" in done.stdout  # /metrics
            continue
        for command in commands(block):
            plain = without_sudo(command).split("  #")[0].strip()
            plain = plain.replace("1842", "1").replace("relay-2026-12-01.db", f"relay-{today}.db")
            if plain.startswith(("journalctl ", "editor ")):
                continue  # no journal here; the env file is left as it is
            if plain.startswith("systemctl "):
                await systemd.run(plain)
                continue
            done = await asyncio.to_thread(machine.run, machine.rewrite(plain))
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            if plain == "relay check":
                assert "secrets read from:" in done.stdout, done.stdout
    # Upgraded: the service runs a version installed beside the first one, kept.
    assert systemd.service is not None
    relay = machine.path("/usr/local/bin/relay")
    if variant == "venv":
        assert relay.resolve().parents[1] != machine.path("/opt/relay")
        assert machine.path("/opt/relay/bin/relay").exists()
    else:
        assert machine.path("/usr/local/bin/relay-previous").exists()


def _wait_message(service: Service, prefix: str, after: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(m.startswith(prefix) for _, m in service.notify.messages[after:]):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {prefix} after a reload:\n{service.log_text()}")


def read_unit_documentation(unit_path: Path) -> list[Path]:
    found = []
    for line in unit_path.read_text().splitlines():
        if line.startswith("Documentation=file://"):
            found.append(Path(line.removeprefix("Documentation=file://")))
    return found


def _installed_units(machine: Machine) -> None:
    """The units as installed name system paths, and the sockets' ports, which
    move to this test's free ones as the config's do."""
    folder = machine.path("/etc/systemd/system")
    for unit in folder.glob("relay*"):
        text = machine.rewrite(unit.read_text())
        text = text.replace(
            "ListenStream=127.0.0.1:8080", f"ListenStream=127.0.0.1:{machine.ingress_port}"
        )
        unit.write_text(
            text.replace(
                "ListenStream=127.0.0.1:8081", f"ListenStream=127.0.0.1:{machine.admin_port}"
            )
        )


async def _follow(
    machine: Machine, command: str, env_example: str, crm_url: str, systemd: Systemd
) -> None:
    """Run one command of the guide."""
    plain = without_sudo(command)
    if plain.startswith("apt install "):
        for package in plain.split()[2:]:
            installed = await asyncio.to_thread(machine.run, f"dpkg -s {shlex.quote(package)}")
            assert installed.returncode == 0, f"{package} is not installed (CI installs it)"
        return
    if plain.startswith("editor "):
        path = machine.path(plain.split()[1])
        assert path.name == "relay.env", f"the test does not know how to edit {path}"
        path.write_text(env_file_text(env_example, crm_url))
        return
    if plain.startswith("systemctl "):
        await systemd.run(plain)
        return
    result = await asyncio.to_thread(machine.run, machine.rewrite(plain))
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    if plain == "relay --version":  # both installs compile the hot path, as the guide says
        assert result.stdout.strip().endswith("hot path compiled (mypyc)"), result.stdout
    if " init " in f" {plain} ":
        config = machine.path("/etc/relay/relay.toml")
        text = config.read_text()
        assert '"127.0.0.1:8080"' in text
        assert '"127.0.0.1:8081"' in text
        text = text.replace("127.0.0.1:8080", f"127.0.0.1:{machine.ingress_port}")
        config.write_text(text.replace("127.0.0.1:8081", f"127.0.0.1:{machine.admin_port}"))


def test_no_account_has_the_service_uids() -> None:
    for uid in (SERVICE_UID, OTHER_UID):
        with pytest.raises(KeyError):
            pwd.getpwuid(uid)
