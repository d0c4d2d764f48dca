"""The outbound policy (relay.targets.outbound.policy) without a socket: redirects,
the classification of an answer, Retry-After and the header rules, each a
table driven through a whole fake transport (tests/transports.py)."""

from __future__ import annotations

import base64
import email.utils
import time

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from relay.core.outcome import RESPONSE_EXCERPT_BYTES, Verdict
from relay.targets.outbound.policy import (
    MAX_REDIRECTS,
    RETRY_AFTER_LIMIT,
    Follow,
    answer_says,
    classify,
    exchange,
    parse_retry_after,
)
from relay.targets.outbound.transport import (
    Answer,
    ClientError,
    ConnectError,
    Request,
    RequestError,
)

from transports import MockTransport, answer

NOW = 1_800_000_000.0


def headers(**given: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in given.items()}))


# -- classify ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retry_after", "body", "verdict", "error", "wait"),
    [
        (200, None, b"ok", Verdict.SUCCESS, None, None),
        (204, None, b"", Verdict.SUCCESS, None, None),
        (299, None, b"", Verdict.SUCCESS, None, None),
        (400, None, b'{"error_description": "Phone  is\\nnot valid"}', Verdict.FAIL,
         "HTTP 400: Phone is not valid", None),
        (404, None, b"<html>", Verdict.FAIL, "HTTP 404", None),
        (409, "30", b"", Verdict.FAIL, "HTTP 409", None),  # a 4xx's Retry-After changes nothing
        (429, "30", b"", Verdict.RETRY, "HTTP 429", 30.0),
        (429, None, b"", Verdict.RETRY, "HTTP 429", None),
        (503, "²", b'{"error": "QUERY_LIMIT_EXCEEDED"}', Verdict.RETRY,
         "HTTP 503: QUERY_LIMIT_EXCEEDED", None),
        (500, "120", b"[1, 2]", Verdict.RETRY, "HTTP 500", 120.0),
        (599, None, b"", Verdict.RETRY, "HTTP 599", None),
        (302, None, b"", Verdict.FAIL, "HTTP 302", None),  # only ever a redirect's answer
    ],
)  # fmt: skip
def test_classify(
    status: int,
    retry_after: str | None,
    body: bytes,
    verdict: Verdict,
    error: str | None,
    wait: float | None,
) -> None:
    given = headers(Retry_After=retry_after) if retry_after is not None else headers()
    outcome = classify(status, given, body)
    assert (outcome.verdict, outcome.error, outcome.retry_after) == (verdict, error, wait)
    assert (outcome.status, outcome.response) == (status, body)


# -- Retry-After -------------------------------------------------------------------


def http_date(at: float) -> str:
    return email.utils.formatdate(at, usegmt=True)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("", None),
        ("120", 120.0),
        ("  7 ", 7.0),
        ("0", 0.0),
        ("0" * 40 + "5", 5.0),  # leading zeros are still five seconds
        ("²", None),  # str.isdigit() says yes, float() says no
        ("١٢", None),  # Arabic-Indic digits: digits to Python, not to RFC 9110
        ("1e3", None),
        ("-5", None),
        ("3.5", None),  # delay-seconds is 1*DIGIT
        ("soon", None),
        ("9" * 13, RETRY_AFTER_LIMIT),  # past any cap the scheduler has
        ("9" * 5000, RETRY_AFTER_LIMIT),  # int() refuses 4300+ digits; float() would say inf
        (http_date(NOW + 90), 90.0),
        (http_date(NOW - 90), 0.0),  # a date gone by: at once
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),  # RFC 9110's example, long past
        ("Fri, 31 Dec 9999 23:59:59 GMT", RETRY_AFTER_LIMIT),
        ("Mon, 32 Foo 2030 25:61:61 GMT", None),
        ("x" * 100_000, None),  # a long header costs one length check
    ],
)
def test_retry_after(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


def test_retry_after_of_a_huge_header_is_linear() -> None:
    """A target chooses the header: a number or a date of any length is one pass."""
    for junk in ("9" * 1_000_000, "Sun, " + "1" * 1_000_000):
        started = time.process_time()
        parse_retry_after(junk, now=NOW)
        assert time.process_time() - started < 0.05


# -- one exchange through the fake transport ------------------------------------------

URL = "http://crm.example:8000/hook"


def request(url: str = URL, **extra: str) -> Request:
    return Request("POST", url, {"Idempotency-Key": "k1", **extra}, b'{"order": 1}')


async def test_an_answer_goes_to_the_judge_and_network_trouble_is_a_retry() -> None:
    transport = MockTransport(lambda sent: answer(201, body=b"x" * 5000))
    outcome = await exchange(transport, request(), classify)
    assert (outcome.verdict, outcome.status) == (Verdict.SUCCESS, 201)
    assert len(outcome.response) == RESPONSE_EXCERPT_BYTES  # the transport was asked no more
    for error, verdict in (
        (ConnectError("crm.example", 8000, "Connection refused"), Verdict.RETRY),
        (RequestError("header 'X' cannot be sent"), Verdict.FAIL),
    ):
        failing = MockTransport(lambda sent, error=error: error)  # type: ignore[misc]
        outcome = await exchange(failing, request(), classify)
        assert (outcome.verdict, outcome.error) == (verdict, str(error))


async def test_a_status_whose_body_stalled_is_the_answer() -> None:
    stalled = MockTransport(lambda sent: answer(200, body=b"par", whole=False))
    outcome = await exchange(stalled, request(), classify)
    assert outcome.verdict is Verdict.SUCCESS
    assert outcome.error == "HTTP 200; its body stopped coming, kept as sent"
    refused = MockTransport(lambda sent: answer(503, body=b"par", whole=False))
    assert (await exchange(refused, request(), classify)).verdict is Verdict.RETRY


async def test_user_and_password_in_the_url_go_as_basic_authorization() -> None:
    """Every transport gets the same request: the URL without its credentials,
    and Authorization made of them (unless one is configured)."""
    transport = MockTransport(lambda sent: answer(200))
    await exchange(transport, request("http://crm%40user:p%3Ass@crm.example/v1"), classify)
    await exchange(
        transport,
        request("http://u:p@crm.example/v1", Authorization="Bearer configured"),
        classify,
    )
    first, second = transport.requests
    assert first.url == second.url == "http://crm.example/v1"
    assert first.headers["Authorization"] == "Basic " + base64.b64encode(b"crm@user:p:ss").decode()
    assert second.headers["Authorization"] == "Bearer configured"


def redirecting(*locations: str, status: int = 307) -> MockTransport:
    """`status` to each location in turn, then 200 to whatever comes next."""
    answers = [answer(status, {"Location": where}) for where in locations]

    def handle(sent: Request) -> Answer | ClientError:
        return answers.pop(0) if answers else answer(200, body=b"moved in")

    return MockTransport(handle)


# (status, Location, Follow, followed to, or the reason's words)
REDIRECTS: list[tuple[int, str, Follow | None, str]] = [
    (307, "/v2/hook?x=1", Follow(), "http://crm.example:8000/v2/hook?x=1"),
    (308, "http://CRM.example:8000/v2", Follow(), "http://crm.example:8000/v2"),
    (307, "http://crm.example:8001/v2", Follow(), "another origin (scheme, host and port)"),
    (307, "https://crm.example:8000/v2", Follow(), "another origin (scheme, host and port)"),
    (307, "http://crm.example:8001/v2", Follow(("crm.example",)), "http://crm.example:8001/v2"),
    (307, "http://other.example:8000/", Follow(), "another origin"),
    (307, "http://other.example/", Follow(("other.example",)), "http://other.example/"),
    (307, "/v2", None, "redirects are not followed; if the target moved, set its url"),
    (301, "/v2", Follow(), "not followed (301 may turn a POST into a GET)"),
    (302, "/v2", Follow(), "not followed (302 may turn a POST into a GET)"),
    (303, "/v2", Follow(), "not followed (303 may turn a POST into a GET)"),
    (307, "", Follow(), "HTTP 307 without a Location: a redirect to nowhere"),
    (307, "   ", Follow(), "HTTP 307 without a Location: a redirect to nowhere"),
    (307, "file:///etc/passwd", Follow(("crm.example",)), "not an http(s) URL, never followed"),
    (307, "ftp://crm.example/x", Follow(), "not an http(s) URL, never followed"),
    (307, "javascript:alert(1)", Follow(), "not an http(s) URL, never followed"),
    (307, "gopher://crm.example:8000/", Follow(), "not an http(s) URL, never followed"),
    (307, "http://[::1/", Follow(), "a Location that is not a URL"),
    (307, "http://crm.example:99999/", Follow(), "a Location that is not a URL"),
]


@pytest.mark.parametrize(("status", "location", "follow", "expected"), REDIRECTS)
async def test_redirects(status: int, location: str, follow: Follow | None, expected: str) -> None:
    transport = redirecting(location, status=status)
    outcome = await exchange(transport, request(), classify, follow=follow)
    if expected.startswith("http"):
        assert outcome.verdict is Verdict.SUCCESS, outcome.error
        first, second = transport.requests
        assert second.url == expected
        assert (second.method, second.body) == (first.method, first.body)  # 307/308: as it was
        assert second.headers["Idempotency-Key"] == "k1"
        return
    # A redirect not followed is a delivery's permanent failure on one line,
    # never an exception out of the target.
    assert outcome.verdict is Verdict.FAIL
    assert outcome.error is not None
    assert expected in outcome.error
    assert "\n" not in outcome.error
    assert outcome.status == status
    assert len(transport.requests) == 1


async def test_credentials_go_to_the_same_origin_only() -> None:
    """user:password and credential headers follow a redirect to the same
    scheme, host and port, and to nowhere else, a listed host included (a 307
    to another port of one host is another server)."""
    url = "http://crm:secret@crm.example:8000/hook"
    cases = [
        ("/v2", Follow(), True),
        ("http://crm.example:8001/v2", Follow(("crm.example",)), False),
        ("http://other.example:8000/v2", Follow(("other.example",)), False),
    ]
    for location, follow, carried in cases:
        transport = redirecting(location)
        given = request(url, Cookie="session=1")
        outcome = await exchange(transport, given, classify, follow=follow)
        assert outcome.verdict is Verdict.SUCCESS
        first, second = transport.requests
        assert "secret" not in second.url
        assert first.headers["Authorization"].startswith("Basic ")
        assert ("Authorization" in second.headers) is carried, location
        assert ("Cookie" in second.headers) is carried, location
    configured = redirecting("http://crm.example:8001/v2")
    given = request(Authorization="Bearer t0ken")
    await exchange(configured, given, classify, follow=Follow(("crm.example",)))
    assert "Authorization" not in configured.requests[1].headers


async def test_http_to_https_on_the_default_ports_is_the_same_origin() -> None:
    transport = redirecting("https://crm.example/v2")
    given = request("http://u:pw@crm.example/hook")
    outcome = await exchange(transport, given, classify, follow=Follow())
    assert outcome.verdict is Verdict.SUCCESS
    assert transport.requests[1].url == "https://crm.example/v2"
    assert (
        transport.requests[1].headers["Authorization"]
        == transport.requests[0].headers["Authorization"]
    )
    back = redirecting("http://crm.example/v2")
    outcome = await exchange(back, request("https://crm.example/hook"), classify, follow=Follow())
    assert outcome.error is not None
    assert "from https to http, never followed" in outcome.error


@pytest.mark.parametrize(
    ("own", "location"),
    [
        ((("127.0.0.1", 8081),), "http://127.0.0.1:8081/api/v1/requeue"),
        ((("127.0.0.1", 8081),), "http://localhost:8081/api/v1/requeue"),  # a name is looked up
        ((("127.0.0.1", 8081),), "http://127.0.0.2:8081/"),  # any loopback address
        # "this host": a connection to it reaches local listeners as loopback does
        ((("127.0.0.1", 8081),), "http://0.0.0.0:8081/api/v1/requeue"),
        ((("::1", 8081),), "http://[::]:8081/api/v1/requeue"),
        ((("0.0.0.0", 8080),), "http://127.0.0.1:8080/hooks/orders"),  # all addresses: any local
        ((("::", 8080),), "http://[::1]:8080/hooks/orders"),
        ((("127.0.0.1", 8080), ("127.0.0.1", 8081)), "https://127.0.0.1:8080/"),
    ],
)
async def test_a_redirect_never_goes_to_relays_own_listeners(
    own: tuple[tuple[str, int], ...], location: str
) -> None:
    """The same host listed, and still refused: relay must never send to itself
    (a target's 307 to the admin API would requeue every delivery)."""
    transport = redirecting(location)
    here = request("http://127.0.0.1:9000/hook")
    hosts = ("127.0.0.1", "localhost", "127.0.0.2", "::1", "0.0.0.0", "::")
    outcome = await exchange(transport, here, classify, follow=Follow(hosts, own))
    assert outcome.error is not None
    assert "one of relay's own listeners, never followed" in outcome.error
    assert len(transport.requests) == 1


async def test_a_redirect_to_another_local_port_is_not_taken_for_relays_own() -> None:
    transport = redirecting("http://127.0.0.1:9001/v2")
    own = (("127.0.0.1", 8080), ("127.0.0.1", 8081))
    here = request("http://127.0.0.1:9000/hook")
    outcome = await exchange(transport, here, classify, follow=Follow(("127.0.0.1",), own))
    assert outcome.verdict is Verdict.SUCCESS
    assert transport.requests[1].url == "http://127.0.0.1:9001/v2"


async def test_redirects_stop_after_five() -> None:
    transport = redirecting(*["/again"] * 10)
    outcome = await exchange(transport, request(), classify, follow=Follow())
    assert outcome.error == f"more than {MAX_REDIRECTS} redirects, the last to" + (
        " http://crm.example:8000/again"
    )
    assert len(transport.requests) == MAX_REDIRECTS + 1


async def test_a_paced_turn_is_taken_once_for_all_hops() -> None:
    turns = 0

    async def paced() -> None:
        nonlocal turns
        turns += 1

    transport = redirecting("/v2", "/v3")
    outcome = await exchange(transport, request(), classify, paced, follow=Follow())
    assert outcome.verdict is Verdict.SUCCESS
    assert (turns, len(transport.requests)) == (1, 3)


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        # RetailCRM API v5: an unsuccessful answer is {"success": false,
        # "errorMsg": ..., "errors": {field: message}} (it showed as "HTTP 400").
        (
            {
                "success": False,
                "errorMsg": "Order already exists.",
                "errors": {"externalId": "Order with externalId 1001 already exists."},
            },
            "Order already exists. (externalId: Order with externalId 1001 already exists.)",
        ),
        # amoCRM's "List of API errors" (amocrm.com/developers/content/api/errors):
        # a validation error names each field's path.
        (
            {
                "validation-errors": [
                    {
                        "request_id": "0",
                        "errors": [
                            {
                                "code": "NotSupportedChoice",
                                "path": "custom_fields_values.0.field_id",
                                "detail": "The value you selected is not a valid choice.",
                            }
                        ],
                    }
                ],
                "title": "Bad Request",
                "type": "https://httpstatus.es/400",
                "status": 400,
                "detail": "Request validation failed",
            },
            "Request validation failed (custom_fields_values.0.field_id: The value you"
            " selected is not a valid choice.)",
        ),
        ({"error": "QUERY_LIMIT_EXCEEDED", "error_description": "Too many"}, "Too many"),
        ({"errors": ["a", "b", "c", "d", "e"]}, "a; b; c; 2 more"),
    ],
)
def test_a_crms_reason_and_field_errors_are_read(answer: dict[str, object], said: str) -> None:
    assert answer_says(orjson.dumps(answer)) == said
    outcome = classify(400, CIMultiDictProxy(CIMultiDict()), orjson.dumps(answer))
    assert outcome.error == f"HTTP 400: {said}"
