"""Keys keep the distinctness of their bytes; form fields are found whatever their case."""

from __future__ import annotations

from relay.core.exact import key_bytes, stored_key
from relay.core.fields import FormFields
from relay.core.payload import MAX_FORM_FIELDS, parse_form
from relay.templates import compile_template, marking_defaults


def as_aiohttp_gives(raw: bytes) -> str:
    """Header bytes as aiohttp hands them over: undecodable bytes as surrogates."""
    return raw.decode("utf-8", "surrogateescape")


def test_cp1251_keys_stay_distinct_and_reversible() -> None:
    order = "заказ-1".encode("cp1251")
    item = "товар-1".encode("cp1251")
    first, second = stored_key(as_aiohttp_gives(order)), stored_key(as_aiohttp_gives(item))
    assert first != second
    assert first == "\\xe7\\xe0\\xea\\xe0\\xe7-1"
    assert key_bytes(first) == order
    assert key_bytes(second) == item
    with_backslash = b"a\\b\xff"
    assert key_bytes(stored_key(as_aiohttp_gives(with_backslash))) == with_backslash


def test_valid_keys_are_stored_as_they_are() -> None:
    for key in ("order-1", "заказ-1", "a\\xe7", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"):
        assert stored_key(key) == key


def test_form_fields_are_found_ignoring_case_after_an_exact_match() -> None:
    form = parse_form("application/x-www-form-urlencoded", b"Name=Anna&Phone=%2B7&name=exact")
    assert isinstance(form, FormFields)
    assert form["name"] == "exact"  # an exact name wins
    assert form["NAME"] == "Anna"  # else the first field in order, any case
    assert form.get("phone") == "+7"
    assert "PHONE" in form
    assert "email" not in form
    assert form.get("email", "-") == "-"
    assert list(form) == ["Name", "Phone", "name"]  # nothing renamed
    text = compile_template("{{ form.phone }} {{ form['PHONE'] }}").render({"form": form})
    assert text == "+7 +7"


def test_defaults_used_are_listed_while_marking() -> None:
    template = compile_template(
        "{{ form.Name | default('no name') }}|{{ form.comment | default('') }}"
        "|{{ form.x | d('-') }}"
    )
    form = FormFields(Name="Anna")
    assert template.render({"form": form}) == "Anna||-"
    with marking_defaults() as used:
        assert template.render({"form": form}) == "Anna||-"  # the output is unchanged
    assert used == ["no comment = ''", "no x = '-'"]


def test_a_form_is_read_up_to_its_field_limit() -> None:
    urlencoded = "application/x-www-form-urlencoded"
    at_limit = "&".join(["Phone=1"] * MAX_FORM_FIELDS).encode()
    assert parse_form(urlencoded, at_limit) == {"Phone": "1"}
    assert parse_form(urlencoded, at_limit + b"&Name=x") is None  # one more: not read
