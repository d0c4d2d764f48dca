"""Shared pieces of the benchmarks: servers in subprocesses, wrk runs, tables.

Every benchmark measures its baseline in the same run, alternating rounds,
because these machines are shared and absolute figures drift.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def relay_command() -> list[str]:
    """How a benchmark starts relay: with $RELAY_PYTHON when set (say, the
    Python of a virtual environment holding the compiled wheel:
    `RELAY_MYPYC=1 pip install .`), else this interpreter. -P keeps the
    working directory off sys.path: run from a checkout, `-m relay` would
    import the checkout's pure sources whatever the interpreter has installed."""
    python = os.environ.get("RELAY_PYTHON")
    return [os.path.abspath(python) if python else sys.executable, "-P", "-m", "relay"]


WRK_SCRIPT = r"""
counter = 0
tid = 0
made = 0
-- Each wrk thread has a Lua state of its own: its number keeps the keys apart.
setup = function(thread)
  made = made + 1
  thread:set("tid", made)
end
wrk.method = "POST"
wrk.body = BODY
wrk.headers["Content-Type"] = "application/json"
request = function()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = string.format("k-%d-%d-%d", PREFIX, tid, counter)
  return wrk.format()
end
DELAY
done = function(summary, latency, requests)
  io.write(string.format(
    "RESULT {\"requests\": %d, \"non2xx\": %d, \"errors\": %d, \"seconds\": %f, "
    .. "\"p50\": %f, \"p99\": %f, \"p999\": %f}\n",
    summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000))
end
"""


def body_1kib() -> str:
    """A ~1 KiB JSON order, like a WooCommerce or T-Bank notification."""
    items = ",".join(
        f'{{"sku":"SKU-{i:04d}","name":"Item number {i}","qty":{i % 3 + 1},"price":{i * 100}}}'
        for i in range(9)
    )
    body = f'{{"event":"order.created","order":{{"id":1001,"currency":"RUB","items":[{items}]}}}}'
    return body.ljust(1024)


@dataclass
class WrkResult:
    requests: int
    non2xx: int
    errors: int
    seconds: float
    p50: float  # milliseconds
    p99: float
    p999: float
    threads: int = 1
    # wrk's own CPU over the run, in cores (1.0: one core busy all along).
    generator_cores: float = 0.0
    # The cores wrk may use (1 when pinned to one): at ~90 % of them the
    # generator, not the server, sets the rate.
    generator_limit: float = 1.0

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def acked(self) -> int:
        return self.requests - self.non2xx

    @property
    def saturated(self) -> bool:
        """The load generator was busy nearly all the time: the rate it
        measured may be its own limit, not the server's."""
        return self.generator_cores >= 0.9 * self.generator_limit


def percentile(ordered: list[float], share: float) -> float:
    """The value at `share` (0.99 for p99) of a sorted list, as wrk reads its histogram."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def percentiles(ordered: list[float]) -> dict[str, float]:
    """p50, p99 and p999 of a sorted list, as the benchmarks' JSON names them."""
    return {
        "p50": percentile(ordered, 0.5),
        "p99": percentile(ordered, 0.99),
        "p999": percentile(ordered, 0.999),
    }


def as_wrk_counts(latencies: list[float], interval: float) -> list[float]:
    """Latencies as wrk counts them, sorted: its coordinated-omission correction
    (stats_correct in wrk's src/stats.c) adds, for every latency of at least
    twice the expected interval between requests, one more at each interval
    below it. A stall then counts by its length, as it would for senders that
    do not wait for each other. wrk takes the run's mean interval per
    connection."""
    counted = list(latencies)
    for latency in latencies:
        if latency >= 2 * interval:
            later = latency - interval
            while later > interval:
                counted.append(later)
                later -= interval
    counted.sort()
    return counted


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def cpu_prefix(cpu: int | str | None) -> list[str]:
    if cpu is None or shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return []
    return ["taskset", "-c", str(cpu)]


class CpuQuota:
    """A cgroup holding each process started under it to `cores` of a CPU
    (cgroup v1's cpu controller or v2's cpu.max; needs root): a process as
    on a small host of its own, whatever this machine has."""

    PERIOD_US = 100_000

    def __init__(self, name: str, cores: float) -> None:
        quota = max(1000, round(cores * self.PERIOD_US))
        unified = Path("/sys/fs/cgroup")
        controllers = unified / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            (unified / "cgroup.subtree_control").write_text("+cpu")
            self.path = unified / name
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            self.path = Path("/sys/fs/cgroup/cpu") / name
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def prefix(self) -> list[str]:
        """A command prefix: the process joins the cgroup, then execs the command."""
        procs = self.path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]

    def remove(self) -> None:
        """Once its processes are gone."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def run_wrk(
    url: str,
    *,
    connections: int,
    seconds: float,
    prefix: int,
    cpu: int | str | None,
    rate: float | None = None,
    threads: int = 1,
) -> WrkResult:
    """wrk with ~1 KiB JSON POSTs and unique idempotency keys; `rate` (requests a
    second, all connections together) paces it instead of going flat out. Its
    own CPU is measured (WrkResult.saturated)."""
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    pacing = ""
    if rate is not None:
        # Each connection waits this long before each request (wrk's delay hook).
        pacing = f"delay = function() return {connections * 1000 / rate:.3f} end"
    script = (
        WRK_SCRIPT.replace("BODY", json.dumps(body_1kib()))
        .replace("PREFIX", str(prefix))
        .replace("DELAY", pacing)
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    # wrk's CPU: what this process's waited-for children used while it ran
    # (the servers are waited for only when they stop, after it).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        output = subprocess.run(
            [
                *cpu_prefix(cpu),
                "wrk",
                f"-t{threads}",
                f"-c{connections}",
                f"-d{int(seconds)}s",
                "-s",
                handle.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(handle.name)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"RESULT (\{.*\})", output)
    if match is None:
        raise RuntimeError(f"wrk printed no result:\n{output}")
    result = WrkResult(**json.loads(match.group(1)), threads=threads)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result.generator_cores = used / max(result.seconds, 1e-9)
    result.generator_limit = 1.0 if cpu_prefix(cpu) else float(os.cpu_count() or 1)
    return result


def load_webhooks(
    server: Server,
    *,
    connections: int,
    seconds: float,
    prefix: int,
    cpu: int | str | None,
    threads: int = 1,
) -> tuple[WrkResult, float]:
    """wrk flat out at the server's /hooks/orders: its result, and the CPU
    seconds the server used meanwhile."""
    before = server.cpu_seconds()
    result = run_wrk(
        f"http://127.0.0.1:{server.port}/hooks/orders",
        connections=connections,
        seconds=seconds,
        prefix=prefix,
        cpu=cpu,
        threads=threads,
    )
    return result, server.cpu_seconds() - before


class Server:
    """A server process started for a benchmark, stopped by its own PID."""

    def __init__(
        self,
        command: list[str],
        port: int,
        *,
        cpu: int | str | None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.process = subprocess.Popen(
            [*cpu_prefix(cpu), *command],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_for_port(port)
        except RuntimeError:
            self.stop()
            raise

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (Linux /proc)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat): two
    readings give how many cores anything used between them, this benchmark's
    processes and everyone else's."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return float(sum(fields) - idle), float(sum(fields))


def print_table(title: str, headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    for row in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))


def relay_build() -> str:
    """What `relay --version` says of the relay the benchmarks start: whether
    its hot path is compiled."""
    return subprocess.run(
        [*relay_command(), "--version"], capture_output=True, text=True, check=True, cwd="/"
    ).stdout.strip()


def write_json(name: str, data: dict[str, object], *, one_build: bool = True) -> Path:
    """The results, with the relay build they were measured on (printed too)
    when the benchmark ran the one relay_command() starts."""
    record = data
    if one_build:
        build = relay_build()
        print(f"measured on: {build}")
        record = {"relay": build, **data}
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, default=lambda o: asdict(o)))
    return path


def peak_children_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def relay_to_sink_config(
    folder: Path,
    port: int,
    admin_port: int,
    sink_port: int,
    concurrency: int,
    *,
    log_level: str = "info",
    order_by: str | None = None,
    storage_url: str | None = None,
    name: str = "relay.toml",
    transport: str | None = None,
) -> Path:
    """relay with one route into one HTTP target, `crm`, at the local sink; its
    store a SQLite file in `folder`, or the database at `storage_url`;
    `transport` the target's (relay.targets.outbound), its default when None."""
    target = f'{{ target = "crm", order_by = "{order_by}" }}' if order_by else '"crm"'
    storage = f'url = "{storage_url}"' if storage_url else 'path = "relay.db"\nsynchronous = "full"'
    path = folder / name
    path.write_text(f"""
[server]
listen = "127.0.0.1:{port}"
shutdown_timeout = "2s"

[admin]
listen = "127.0.0.1:{admin_port}"

[storage]
{storage}

[log]
level = "{log_level}"

[targets.crm]
type = "http"
url = "http://127.0.0.1:{sink_port}/hook"
concurrency = {concurrency}
{f'transport = "{transport}"' if transport else ""}

[routes.orders]
path = "/hooks/orders"
targets = [{target}]
""")
    return path


def crm_counts(admin_port: int, timeout: float = 30.0) -> dict[str, int]:
    """Deliveries to `crm` by status, from the admin API's stats."""
    url = f"http://127.0.0.1:{admin_port}/api/v1/stats"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        stats = json.load(response)
    return {k: int(v) for k, v in stats["targets"].get("crm", {}).items() if isinstance(v, int)}
