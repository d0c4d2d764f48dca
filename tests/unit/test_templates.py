import pytest

from relay.core.budget import TemplateError
from relay.core.fields import FormFields
from relay.core.payload import header_map
from relay.templates import compile_expression, compile_template


def test_renders_and_knows_its_variables() -> None:
    template = compile_template("{{ json.event.id }}-{{ headers['X-A'] }}")
    assert template.variables == {"json", "headers"}
    assert template.render({"json": {"event": {"id": 7}}, "headers": {"X-A": "a"}}) == "7-a"


def test_missing_field_is_an_error_unless_defaulted() -> None:
    with pytest.raises(TemplateError, match=r"field missing is missing"):
        compile_template("{{ json.missing }}").render({"json": {}})
    assert compile_template("{{ json.missing | default('x') }}").render({"json": {}}) == "x"


@pytest.mark.parametrize(
    ("source", "context", "said"),
    [
        # Said in the payload's words, never Python's ("'relay.core.fields.
        # FormFields object' has no attribute 'utm_source'").
        ("{{ form.utm_source }}", {"form": FormFields(Name="Anna")}, "form field utm_source"),
        ("{{ json.customer.phone }}", {"json": {"customer": {}}}, "field phone is missing"),
        ("{{ headers['X-Shop'] }}", {"headers": header_map([])}, "header X-Shop is missing"),
        ("{{ json.total.rub }}", {"json": {"total": 5}}, "rub is missing (the value is int"),
        ("{{ nothing }}", {}, "'nothing' is undefined"),
    ],
)
def test_a_missing_value_is_said_in_the_payloads_words(
    source: str, context: dict[str, object], said: str
) -> None:
    with pytest.raises(TemplateError) as error:
        compile_template(source).render(context)
    assert said in str(error.value)
    assert "relay." not in str(error.value)
    assert "object'" not in str(error.value)


def test_json_keeps_letters_as_letters() -> None:
    # tojson escaped every non-ASCII letter: a Cyrillic name reached the CRM
    # as \u0410\u043d\u043d\u0430 (most senders and CRMs read UTF-8 JSON).
    out = compile_template("{{ json | tojson }}").render({"json": {"name": "Анна <b>"}})
    assert out == '{"name": "Анна \\u003cb\\u003e"}'  # still safe inside HTML


def test_syntax_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="syntax error"):
        compile_template("{{ json. }}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ json.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
    ],
)
def test_sandbox_blocks_attribute_escapes(source: str) -> None:
    with pytest.raises(TemplateError):
        compile_template(source).render({"json": {}})


def test_runaway_output_is_refused() -> None:
    template = compile_template("{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}")
    with pytest.raises(TemplateError, match="exceeds"):
        template.render({})


def test_conditions() -> None:
    condition = compile_expression("json.Status == 'CONFIRMED'")
    assert condition.holds({"json": {"Status": "CONFIRMED"}})
    assert not condition.holds({"json": {"Status": "NEW"}})


def test_runaway_loops_without_output_are_refused_too() -> None:
    nested = compile_template(
        "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"
    )
    with pytest.raises(TemplateError, match="too expensive"):
        nested.render({})
    lookups = compile_template(
        "{% for a in json.l %}{% for b in json.l %}{{ b.x }}{% endfor %}{% endfor %}"
    )
    with pytest.raises(TemplateError, match="too expensive"):
        lookups.render({"json": {"l": [{"x": ""}] * 3000}})
    # The budget is per render: an ordinary template is not charged for the last one.
    assert compile_template("{{ json.a }}").render({"json": {"a": 1}}) == "1"
