"""A second lone sender beside wrk: one blocking socket posting bench/common.py's
~1 KiB webhook, each request after the last answer, timing each from its first
byte sent to its answer's last byte read.

    python bench/raw_sender.py PORT SECONDS PREFIX

Prints one JSON line: requests, non2xx, seconds, p50, p99, p999 (ms).

The two measure different things. This one reports each request's own
latency. wrk corrects its histogram for coordinated omission (stats_correct in
wrk's src/stats.c: every latency over twice the mean interval adds a sample at
each interval below it), which models senders that do not wait for each other,
as a form's visitors do: a stall counts by its length, not once. Against the
bare handlers, which never stall, the two agree; against relay, whose fsynced
commits now and then stall for tens of milliseconds, wrk's p99 is the higher.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import body_1kib, percentiles


def main() -> int:
    port, seconds, prefix = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    body = body_1kib().encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    latencies: list[float] = []
    refused = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        request = webhook_request(f"raw-{prefix}-{len(latencies)}", body)
        began = time.perf_counter()
        sock.sendall(request)
        status = read_answer(sock)
        latencies.append(time.perf_counter() - began)
        refused += not 200 <= status < 300
    elapsed = time.monotonic() - started
    sock.close()
    latencies = sorted(latency * 1000 for latency in latencies)
    print(
        json.dumps(
            {
                "requests": len(latencies),
                "non2xx": refused,
                "errors": 0,
                "seconds": elapsed,
                **percentiles(latencies),
            }
        )
    )
    return 0


def webhook_request(key: str, body: bytes) -> bytes:
    """A POST of `body` to /hooks/orders with idempotency key `key`, as sent."""
    head = (
        "POST /hooks/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\n"
        f"Idempotency-Key: {key}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def read_answer(sock: socket.socket) -> int:
    """The status of one answer with a Content-Length, read to its end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        rest += chunk
    return int(lines[0].split()[1])


if __name__ == "__main__":
    sys.exit(main())
