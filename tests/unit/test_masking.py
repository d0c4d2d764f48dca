"""What every view of a stored request masks, and that the work is linear."""

from __future__ import annotations

import json
import urllib.parse

import orjson

from relay.core.secrets import (
    MASK,
    MAX_VALUE_SECRETS,
    Hidden,
    Masker,
    body_segments,
    inbound_secrets,
    request_masker,
    shown,
    shown_body,
)


def test_json_credential_fields_are_masked_by_name_past_the_value_cap() -> None:
    fields = {f"token{n}": f"value-{n:05d}" for n in range(1000)}
    fields["name"] = "Anna"
    body = orjson.dumps(fields)
    found = inbound_secrets("", "application/json", body)
    assert len(found) == MAX_VALUE_SECRETS  # the rest by name alone
    masker = request_masker(Masker(), "", "application/json", body)
    view = shown_body(body.decode(), "application/json", masker)
    assert "value-" not in view
    assert orjson.loads(view) == {**dict.fromkeys(fields, MASK), "name": "Anna"}


def test_json_values_of_every_shape_are_masked_by_their_keys_name() -> None:
    text = (
        '{"a": {"api_key": "k\\"ey-1", "list": [{"Password": 12345}]},'
        ' "note": "token", "x_signature": "", "ok": true, "token_on": false}'
    )
    view = shown_body(text, "application/json", Masker())
    assert view == (
        '{"a": {"api_key": "***", "list": [{"Password": ***}]},'
        ' "note": "token", "x_signature": "", "ok": true, "token_on": false}'
    )


def test_a_key_written_with_escapes_is_read_as_its_name() -> None:
    text = '{"\\u0074oken": "abcdef"}'
    assert shown_body(text, "application/json", Masker()) == '{"\\u0074oken": "***"}'


def test_a_secret_found_by_name_is_masked_wherever_else_it_shows() -> None:
    body = b'{"token": "tok-123456", "echo": "saw tok-123456 twice: tok-123456"}'
    masker = request_masker(Masker(), "", "application/json", body)
    assert shown_body(body.decode(), "application/json", masker) == (
        '{"token": "***", "echo": "saw *** twice: ***"}'
    )
    assert masker.text("GET /?t=tok-123456") == "GET /?t=***"


def test_longest_secret_first_and_no_secret_matches_inside_a_mask() -> None:
    masker = Masker(["abcdef", "abcdefgh", "***a", "https://b24.example/rest/1/key/"])
    assert masker.text("x abcdefgh y abcdef z") == "x *** y *** z"
    assert masker.text("to https://b24.example/rest/1/key/crm.add") == (
        "to https://b24.example/***/crm.add"
    )
    assert masker.text("***abcdef") == "******"


def test_segments_keep_what_each_mask_hides() -> None:
    masker = Masker(["sec ret"])
    pieces = masker.segments("a=sec+ret&b=sec%20ret")
    assert pieces == ["a=", Hidden("sec+ret"), "&b=", Hidden("sec%20ret"), ""]
    assert shown(pieces) == "a=***&b=***"
    form = body_segments("password=p%40ss&name=A", "application/x-www-form-urlencoded", Masker())
    assert form == ["password=", Hidden("p%40ss"), "&name=A"]


def test_a_body_that_is_not_json_is_masked_by_value_only() -> None:
    text = '{"token": "abcdef"'  # cut short: no structure to trust
    masker = Masker(["abcdef"])
    assert shown_body(text, "application/json", masker) == '{"token": "***"'


def test_a_credential_of_any_shape_is_masked_by_its_name() -> None:
    # A list or an object under a credential's name was shown whole.
    text = (
        '{"password": ["hunter2", {"pin": "0042"}], "api_key": {"live": "sk-123456"},'
        ' "name": "Anna", "note": "a [ bracket", "secret": true}'
    )
    view = shown_body(text, "application/json", Masker())
    assert view == (
        '{"password": ***, "api_key": ***, "name": "Anna", "note": "a [ bracket", "secret": true}'
    )
    found = inbound_secrets("", "application/json", text.encode())
    assert found == {"hunter2", "0042", "sk-123456"}


def test_json_cut_short_is_masked_as_far_as_it_reads() -> None:
    # A body cut to a size (the index reads the first 64 KiB, an attempt keeps
    # a few) is not valid JSON: its credentials are masked by name all the
    # same, a value cut short to its end.
    whole = '{"name": "Anna", "token": "tok-0123456789", "items": [{"password": "hunter2"}]}'
    for cut in range(len(whole)):
        view = shown_body(whole[:cut], "application/json", Masker())
        assert "tok-" not in view
        assert "hu" not in view


def test_a_secret_is_masked_in_every_form_a_peer_may_quote_it_back_in() -> None:
    # A receiver that echoes the request in its JSON answer escapes the secret
    # as its encoder does: quotes and backslashes, non-ASCII as \uXXXX
    # (Python's json, ensure_ascii), and "/" as "\/" (PHP's json_encode).
    secret = 'p/ss"wörd\\1'
    masker = Masker([secret])
    for quoted in (
        orjson.dumps({"echo": secret}).decode(),
        json.dumps({"echo": secret}),
        json.dumps({"echo": secret}).replace("/", "\\/"),
        "pw=" + urllib.parse.quote_plus(secret),
    ):
        assert "ss" not in masker.text(quoted), quoted
