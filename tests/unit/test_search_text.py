"""Search text: what is indexed for an event, and what a query becomes. Tables."""

from __future__ import annotations

import json
import time

import orjson
import pytest

from relay.core.secrets import Masker
from relay.ops.search import (
    MAX_BODY_BYTES,
    MAX_TEXT_CHARS,
    SearchError,
    document,
    fold,
    parse_search,
)
from relay.store import TextSearch

FORM = "application/x-www-form-urlencoded"


def doc(body: bytes, content_type: str | None = FORM, **kwargs: object) -> tuple[str, str]:
    found = document(
        1,
        headers=kwargs.get("headers", []),  # type: ignore[arg-type]
        query=str(kwargs.get("query", "")),
        content_type=content_type,
        body=body,
        masker=kwargs.get("masker", Masker()),  # type: ignore[arg-type]
    )
    return found.text, found.digits


def found_by(query: str, body: bytes, content_type: str | None = FORM) -> bool:
    """Would the index find this body for this query? (Substring semantics of the trigram index.)"""
    text, digits = doc(body, content_type)
    terms = parse_search(query)
    if terms.digits is not None:
        return terms.digits in digits.split(" ") or any(
            terms.digits in run for run in digits.split(" ")
        )
    return all(word in text for word in terms.words)


# Tilda posts application/x-www-form-urlencoded with the fields Name, Email,
# Phone, plus tranid and formid (described in https://exceltic.dev/en/kommo-tilda-forma-v-sdelku/).
TILDA_LEAD = (
    b"Name=%D0%98%D0%B2%D0%B0%D0%BD+%D0%9F%D0%B5%D1%82%D1%80%D0%BE%D0%B2"
    b"&Phone=%2B7+%28999%29+123-45-67&Email=ivan%40example.ru&tranid=1234%3A5678&formid=form1"
)


@pytest.mark.parametrize(
    ("query", "body"),
    [
        ("+7 (999) 123-45-67", TILDA_LEAD),
        ("89991234567", TILDA_LEAD),
        ("79991234567", TILDA_LEAD),
        ("8 999 123 45 67", TILDA_LEAD),
        ("9991234567", TILDA_LEAD),
        ("123-45-67", TILDA_LEAD),
        ("+7 (999) 123-45-67", b"Phone=89991234567"),
        ("+7 (999) 123-45-67", b"Phone=79991234567"),
        ("89991234567", b"Phone=79991234567"),
        ("79991234567", b"Phone=8%20999%20123%2045%2067"),
        ("+79991234567", b"Phone=999+123+45+67"),  # written without a prefix at all
        ("иван", TILDA_LEAD),
        ("ПЕТРОВ", TILDA_LEAD),
        ("петров иван", TILDA_LEAD),  # words in any order
        ("IVAN@EXAMPLE.RU", TILDA_LEAD),
        ("1234:5678", TILDA_LEAD),
    ],
)
def test_a_lead_is_found_however_it_is_asked_for(query: str, body: bytes) -> None:
    assert found_by(query, body)


@pytest.mark.parametrize(
    ("query", "body"),
    [
        ("89991234568", TILDA_LEAD),
        ("сидоров", TILDA_LEAD),
        # Two numbers side by side in different fields are not one number.
        ("7999123456710", b'{"phone": "+7 999 123 45 67", "qty": 10}'),
    ],
)
def test_what_is_not_there_is_not_found(query: str, body: bytes) -> None:
    assert not found_by(query, body, "application/json")


def test_json_values_are_decoded_and_nested_values_reached() -> None:
    body = json.dumps(
        {"order": {"id": 42, "customer": {"name": "Ёлкин"}, "items": [{"sku": "ABC-1"}]}},
        ensure_ascii=True,  # \u escapes: the index holds the letters, not the escapes
    ).encode()
    text, digits = doc(body, "application/json")
    assert "елкин" in text
    assert "abc-1" in text
    assert "\\u" not in text
    assert digits == ""  # 42 is too short to be a number anyone searches for


def test_multipart_fields_are_decoded() -> None:
    body = (
        b'--xyz\r\nContent-Disposition: form-data; name="Phone"\r\n\r\n+7 999 123-45-67\r\n'
        b'--xyz\r\nContent-Disposition: form-data; name="Name"\r\n\r\n'
        + "Мария".encode()
        + b"\r\n--xyz--\r\n"
    )
    text, digits = doc(body, "multipart/form-data; boundary=xyz")
    assert "мария" in text
    assert "79991234567" in digits.split()


def test_headers_and_query_values_are_indexed_but_never_credentials() -> None:
    text, _ = doc(
        b"",
        headers=[
            ("X-Request-Source", "Partner-Portal"),
            ("Authorization", "Bearer abcdef123456"),
            ("X-Tilda-Api-Key", "tilda-key-9876"),
            ("X-Shop-Token", "tok-555555"),
        ],
        query="utm_source=Yandex&token=zzz",
        masker=Masker(["zzz-configured-secret"]),
    )
    assert "partner-portal" in text
    assert "yandex" in text
    assert "abcdef" not in text
    assert "tilda-key" not in text
    assert "tok-555555" not in text


def test_configured_secrets_in_a_body_are_masked_before_indexing() -> None:
    text, _ = doc(b"key=s3cr3t-value-1&name=Anna", masker=Masker(["s3cr3t-value-1"]))
    assert "s3cr3t" not in text
    assert "anna" in text


def test_the_requests_own_credentials_are_never_indexed_even_unconfigured() -> None:
    # Tilda may post its API key as a form field (`api_key`), T-Bank signs with `Token`.
    text, _ = doc(b"api_key=tilda-key-4242&Name=Anna", query="token=q-secret-77")
    assert "tilda-key" not in text
    assert "q-secret" not in text
    assert "anna" in text
    body = b'{"TerminalKey": "T1", "Token": "c0ffee-token-hash", "OrderId": "ord-9"}'
    text, _ = doc(body, "application/json")
    assert "c0ffee" not in text
    assert "ord-9" in text


def test_a_huge_body_costs_bounded_work() -> None:
    values = {f"k{i}": "x" * 10 for i in range(200_000)}
    body = json.dumps(values).encode()
    started = time.perf_counter()
    text, _ = doc(body, "application/json")
    assert time.perf_counter() - started < 1.0
    assert len(text) <= MAX_TEXT_CHARS


def test_fold_is_unicode_aware() -> None:
    assert fold("ИВАН Ёлкин ǅ Straße") == "иван елкин dž strasse"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("+7 (999) 123-45-67", TextSearch(digits="79991234567")),
        ("8 999 123 45 67", TextSearch(digits="79991234567")),
        ("999 123", TextSearch(digits="999123")),
        ("Иван  Петров", TextSearch(words=("иван", "петров"))),
        ("ab Петров", TextSearch(words=("петров",))),  # too short to search alone
        ("order-12", TextSearch(words=("order-12",))),
    ],
)
def test_queries(query: str, expected: TextSearch) -> None:
    assert parse_search(query) == expected


@pytest.mark.parametrize("query", ["", "  ", "ab", "12", "a b c"])
def test_queries_too_short_are_refused_with_a_reason(query: str) -> None:
    with pytest.raises(SearchError, match="at least 3 characters"):
        parse_search(query)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("7" * 7000, "at most 200"),  # held a reader for 17-26 s before
        ("9" * 40, "a number of 40 digits: at most 32"),
        (" ".join(f"word{n}" for n in range(9)), "9 words: at most 8"),
    ],
)
def test_a_search_asks_for_no_more_than_one_search_may(text: str, message: str) -> None:
    with pytest.raises(SearchError, match=message):
        parse_search(text)


def test_no_credential_is_indexed_whatever_the_body_or_its_size() -> None:
    # A search that finds a password is an oracle for it (type a guess, see if
    # an event comes back): a credential never enters the index, by its name
    # at any depth and of any shape, past MAX_VALUE_SECRETS fields, or in a
    # JSON body longer than what the index reads (cut, it is not valid JSON).
    fields = {f"token{n}": f"tok-{n:05d}" for n in range(40)}
    big = {
        "name": "Anna",
        "pad": "x" * (MAX_BODY_BYTES + 10),
        "password": "hunter2-late",
        **fields,
    }
    head_first = {"password": "hunter2-early", "pad": "x" * (MAX_BODY_BYTES + 10)}
    shapes = {"api_key": ["hunter2-list", {"pin": "hunter2-nested"}], "name": "Anna"}
    for body in (big, head_first, shapes, fields):
        text, _ = doc(orjson.dumps(body), content_type="application/json")
        assert "hunter2" not in text
        assert "tok-" not in text
    form = "&".join(f"token{n}=tok-{n:05d}" for n in range(40)) + "&Name=Anna"
    text, _ = doc(form.encode())
    assert "tok-" not in text
    assert "anna" in text
