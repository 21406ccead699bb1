"""Which request fields become which grammar, and which are refused, naming the field."""

from __future__ import annotations

import time
from typing import Any

import pytest

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.errors import RequestError
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_suggeritore.closed_schema import closed
from reame_suggeritore.plugin import Suggeritore
from reame_suggeritore.request_grammar import MAX_GRAMMAR_CHARS, requested_grammar

OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def asked(max_tokens: int = 4, **fields: Any) -> GenerationRequest:
    prompt = FakeBackend().tokenize("Answer.", add_special=True, parse_special=False)
    return GenerationRequest(prompt, SamplingParams(max_tokens=max_tokens), extensions=fields)


def start_engine(backend: FakeBackend) -> Engine:
    host = PluginHost(discover=False)
    host.register(Suggeritore(), "suggeritore")
    host.hook.reame_configure(settings=Settings(), model=backend.info, hook=host.hook)
    return Engine(backend, host).start()


def check(**fields: Any) -> None:
    """The plugin's check of a request, as the engine runs it on the submitting thread."""
    host = PluginHost(discover=False)
    host.register(Suggeritore(), "suggeritore")
    model = FakeBackend().info
    host.hook.reame_configure(settings=Settings(), model=model, hook=host.hook)
    request = asked(**fields)
    host.hook.reame_check_request(request=request, model=model)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"response_format": {"type": "text"}},
        {"response_format": None},
        {"grammar": None, "regex": None},
    ],
)
def test_free_text_asks_no_grammar(fields: dict[str, Any]) -> None:
    assert requested_grammar(asked(**fields)) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_object", "schema": OBJECT}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": OBJECT},
            }
        },
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": OBJECT, "strict": True},
            }
        },
        {"json_schema": OBJECT},
        {"grammar": 'root ::= "yes" | "no"'},
        {"regex": "[a-z]+"},
    ],
)
def test_each_field_asks_a_grammar_that_compiles(fields: dict[str, Any]) -> None:
    grammar = requested_grammar(asked(**fields))

    assert grammar is not None and grammar.field == next(iter(fields))
    check(**fields)


def test_a_schema_under_json_object_is_the_one_followed() -> None:
    loose = requested_grammar(asked(response_format={"type": "json_object"}))
    strict = requested_grammar(asked(response_format={"type": "json_object", "schema": OBJECT}))
    same = requested_grammar(asked(json_schema=OBJECT))

    assert loose is not None and strict is not None and same is not None
    assert strict.text == same.text != loose.text


def test_two_constraints_in_one_request_are_refused() -> None:
    with pytest.raises(RequestError) as refused:
        requested_grammar(asked(json_schema=OBJECT, regex="[a-z]+"))

    assert refused.value.param == "regex"
    assert "'json_schema' and 'regex'" in refused.value.message


BAD = [
    ("response_format", {"type": "xml"}, "type must be one of"),
    ("response_format", "json", "must be an object"),
    ("response_format", {"type": "json_schema"}, "needs 'json_schema'"),
    ("response_format", {"type": "json_schema", "json_schema": {"type": "object"}}, "needs"),
    ("response_format", {"type": "json_object", "schema": [1]}, "JSON schema object"),
    ("json_schema", "not a schema", "JSON schema object"),
    ("json_schema", {"type": "object", "properties": {"a": {"type": "nosuch"}}}, "cannot be used"),
    ("json_schema", {"type": "string", "pattern": "(unclosed"}, "cannot be used"),
    ("json_schema", {"$ref": "#/$defs/missing"}, "cannot be used"),
    ("json_schema", {"type": "string", "minLength": 5, "maxLength": 2}, "cannot be used"),
    ("grammar", 'root ::= undefined_rule "x"', "not a valid GBNF grammar"),
    ("grammar", "", "non-empty string"),
    ("grammar", 42, "non-empty string"),
    ("regex", "(a", "cannot be used"),
    ("regex", "[z-a]", "cannot be used"),
]


@pytest.mark.parametrize(("field", "value", "says"), BAD)
def test_a_bad_field_is_refused_naming_it(field: str, value: Any, says: str) -> None:
    with pytest.raises(RequestError) as refused:
        check(**{field: value})

    assert refused.value.param == field
    assert says in refused.value.message
    assert f"'{field}" in refused.value.message


def test_ignore_eos_cannot_apply_to_a_structured_answer() -> None:
    host = PluginHost(discover=False)
    host.register(Suggeritore(), "suggeritore")
    model = FakeBackend().info
    host.hook.reame_configure(settings=Settings(), model=model, hook=host.hook)
    request = GenerationRequest(
        [1, 2], SamplingParams(max_tokens=4, ignore_eos=True), extensions={"regex": "a+"}
    )

    with pytest.raises(RequestError) as refused:
        host.hook.reame_check_request(request=request, model=model)

    assert refused.value.param == "ignore_eos"


# ------------------------------------------------------------- adversarial


def nested(depth: int, wrap: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    for _ in range(depth):
        schema = wrap(schema)
    return schema


def in_object(inner: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": inner}, "required": ["a"]}


def in_array(inner: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": inner, "minItems": 1}


ADVERSARIAL = [
    pytest.param("json_schema", nested(40, in_object), id="objects-40-deep"),
    pytest.param("json_schema", nested(100, in_array), id="arrays-100-deep"),
    pytest.param("json_schema", nested(2000, in_object), id="objects-2000-deep"),
    pytest.param("json_schema", nested(20_000, in_array), id="arrays-20000-deep"),
    pytest.param(
        "json_schema",
        {
            "type": "object",
            "properties": {
                f"key{i}": {"type": "string", "pattern": f"^[a-z]{{{i}}}x"} for i in range(1500)
            },
        },
        id="1500-patterned-keys",
    ),
    pytest.param(
        "json_schema",
        {"anyOf": [{"type": "string", "pattern": f"^a{i}.*b{i}.*c$"} for i in range(800)]},
        id="800-alternatives",
    ),
    pytest.param("regex", "(a|aa)*b" * 200, id="ambiguous-repeats"),
    pytest.param("regex", "(x+x+)+y", id="nested-plus"),
    pytest.param("regex", "[ab]*a[ab]{40}", id="dfa-2^40-states"),
    pytest.param("regex", "(.*a){30}", id="dot-star-30"),
    pytest.param("regex", "a{1000}{1000}", id="counted-million"),
    pytest.param(
        "grammar",
        "root ::= " + " | ".join(f'"t{i}"' for i in range(12_000)),
        id="12000-alternatives",
    ),
    pytest.param(
        "grammar",
        "root ::= x0\n"
        + "\n".join(f"x{i} ::= x{i + 1} x{i + 1}" for i in range(60))
        + '\nx60 ::= "a"',
        id="2^60-long-text",
    ),
    pytest.param("regex", "a" * (MAX_GRAMMAR_CHARS + 1), id="too-long"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("field", "value"), ADVERSARIAL)
def test_an_adversarial_grammar_is_refused_fast_or_runs_within_bounds(
    field: str, value: Any
) -> None:
    """Huge, deep or explosive inputs are refused, naming the field, within a couple of
    seconds; or they compile within the limits, and then a constrained answer ends within
    bounds too: never a hang (the timeout), never another exception. The bounds are on
    this process's CPU time, which other work on a busy host does not stretch."""
    started = time.process_time()
    try:
        check(**{field: value})
    except RequestError as error:
        assert error.param == field
        assert time.process_time() - started < 3.0
        return
    assert time.process_time() - started < 3.0
    engine = start_engine(FakeBackend())
    try:
        started = time.process_time()
        finished = engine.generate(asked(max_tokens=40, **{field: value}))
    finally:
        engine.stop()
    assert finished.error is None
    assert time.process_time() - started < 10.0


def test_pydantic_schemas_as_instructor_and_openai_send_them_compile() -> None:
    from typing import Literal

    from pydantic import BaseModel, Field

    class Line(BaseModel):
        item: str = Field(max_length=30, description="what was sold")
        quantity: int = Field(ge=1, le=999)

    class Invoice(BaseModel):
        number: str = Field(pattern=r"^INV-[0-9]+$")
        currency: Literal["EUR", "USD"]
        lines: list[Line] = Field(min_length=1, max_length=4)
        total: float = Field(ge=0)
        note: str | None = None

    schema = Invoice.model_json_schema()  # $defs, $ref, titles, anyOf with null, a default

    check(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "Invoice", "schema": schema},
        }
    )
    check(response_format={"type": "json_object", "schema": schema})


def test_objects_that_name_their_properties_admit_no_others_unless_they_say_so() -> None:
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "free": {"type": "object", "properties": {"y": {}}, "additionalProperties": True},
            "any": {"type": "object"},
            "list": {"type": "array", "items": {"properties": {"z": {}}}},
        },
        "$defs": {"d": {"properties": {"w": {}}}},
        "anyOf": [{"properties": {"v": {}}}],
    }

    result = closed(schema)

    assert result["additionalProperties"] is False
    inner = result["properties"]
    assert set(inner) == {"properties", "free", "any", "list"}  # a key named "properties"
    assert inner["properties"]["additionalProperties"] is False
    assert inner["free"]["additionalProperties"] is True
    assert "additionalProperties" not in inner["any"]  # any object stays any object
    assert inner["list"]["items"]["additionalProperties"] is False
    assert result["$defs"]["d"]["additionalProperties"] is False
    assert result["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's own schema is left as sent


def test_the_parts_of_an_allof_stay_open_to_each_others_properties() -> None:
    # Closing each part would make {"a": 1, "b": 2} invalid under the closed schema while the
    # schema as sent accepts it: the parts' nested objects are closed, the parts are not.
    schema = {
        "allOf": [
            {"properties": {"a": {"type": "integer"}}},
            {"properties": {"b": {"type": "object", "properties": {"c": {}}}}},
        ]
    }

    parts = closed(schema)["allOf"]

    assert "additionalProperties" not in parts[0]
    assert "additionalProperties" not in parts[1]
    assert parts[1]["properties"]["b"]["additionalProperties"] is False
