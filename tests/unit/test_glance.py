"""Who an event is about, at a glance (relay.ops.glance), from the senders' own
payloads (tests/fixtures: each folder's SOURCE.md says where from)."""

from __future__ import annotations

from pathlib import Path

from relay.core.secrets import Masker
from relay.ops.glance import HEAD_BYTES, glance
from relay.ops.search import parse_search

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FORM = "application/x-www-form-urlencoded"


def look(content_type: str, body: bytes, query: str = "", search: str | None = None) -> dict:
    terms = parse_search(search) if search else None
    return glance(content_type, body[:HEAD_BYTES], len(body), query, Masker(), terms)


def test_a_tilda_lead_says_name_phone_and_email() -> None:
    lead = (FIXTURES / "tilda" / "lead-default-fields.txt").read_bytes().strip()
    assert look(FORM, lead)["who"] == [
        ["name", "Анна Петрова"],
        ["phone", "+7 (999) 000-00-01"],
        ["email", "anna@example.com"],
    ]


def test_a_woocommerce_order_says_the_buyer_the_order_and_its_total() -> None:
    order = (FIXTURES / "woocommerce" / "order-1.json").read_bytes()
    assert look("application/json", order)["who"] == [
        ["name", "Анна Петрова"],  # billing.first_name and last_name
        ["phone", "+79990000001"],
        ["email", "anna@example.com"],
        ["order", "727"],
        ["amount", "2990.00"],
    ]


def test_a_tbank_notification_says_its_order_and_amount() -> None:
    paid = (FIXTURES / "tbank" / "notification-confirmed.json").read_bytes()
    assert look("application/json", paid)["who"] == [["order", "201709"], ["amount", "19200"]]


def test_a_search_shows_the_words_around_its_match() -> None:
    lead = (FIXTURES / "tilda" / "lead-default-fields.txt").read_bytes().strip()
    assert look(FORM, lead, search="петрова")["snippet"] == "Анна Петрова"
    assert look(FORM, lead, search="8 999 000 00 01")["snippet"] == "+7 (999) 000-00-01"
    assert look(FORM, lead)["snippet"] is None


def test_values_are_masked_and_cut_short() -> None:
    secret = "tilda-key-4242"
    body = f"Name={'Я' * 100}&Email={secret}%40x.ru&api_key={secret}".encode()
    seen = glance(FORM, body, len(body), "", Masker(frozenset({secret})), None)
    name, email = seen["who"]
    assert name[1] == "Я" * 59 + "…"
    assert email == ["email", "***@x.ru"]


def test_only_the_head_is_read_and_a_cut_field_is_left_out() -> None:
    body = b"Name=Anna&Phone=" + b"7" * HEAD_BYTES
    assert look(FORM, body)["who"] == [["name", "Anna"]]
    big = b'{"name": "Anna", "pad": "' + b"x" * HEAD_BYTES + b'"}'
    assert look("application/json", big)["who"] == []  # cut JSON does not parse: nothing


def test_a_money_object_is_its_parents_amount_with_its_currency() -> None:
    # YooKassa's amount is {"value", "currency"} (fixtures/yookassa/SOURCE.md):
    # the first such object named like an amount, not income_amount after it.
    payment = (FIXTURES / "yookassa" / "payment-succeeded.json").read_bytes()
    assert ["amount", "2450.00 RUB"] in look("application/json", payment)["who"]
