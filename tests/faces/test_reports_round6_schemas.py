"""Issue 65, items 1-3 (report kinds from peers' trackers, round six): JSON schemas past the grammar engine's limits.

1. A schema nested deeper than the engine reads (an object 200 levels deep, arrays 300 deep) was pydantic's
   PydanticSerializationError in Python and an HTTP 500 text/plain from the server (the constraint's cache key
   serialised the schema first); a tool whose ``parameters`` nest that deep was a 500 too. Now: one ConstraintError /
   a 400 with OpenAI's error object, naming the limit (``MAX_SCHEMA_DEPTH``), checked before anything reads it.
2. A schema no finite JSON satisfies (``items: {"$ref": "#"}`` with ``minItems: 1``; an object whose required property
   is itself) compiled, then failed at the first decoding step: a 500, or an error inside a 200 stream. Now refused
   when it compiles (before decoding); what the engine finds only while decoding ends the request with a clean error.
3. The CLI printed llguidance's 23-line parser-state dump after its error line; a config file's ``constraint:`` was
   not caught when it loaded. Now: one ``error:`` line, and load_config refuses it.

Over the tiny byte-level BPE model of tests/decode/test_constraints.py and tests/faces/test_serve_structured.py.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from typer.testing import CliRunner  # noqa: E402

import specframe  # noqa: E402
from specframe import cli  # noqa: E402
from specframe.config import load_config  # noqa: E402
from specframe.contracts import DraftTree  # noqa: E402
from specframe.contracts.constraint import (  # noqa: E402
    MAX_SCHEMA_DEPTH,
    TOOL_WRAP_DEPTH,
    ConstraintSpec,
    schema_depth,
)
from specframe.errors import ConfigError, ConstraintError  # noqa: E402
from specframe.grammar.llguidance_engine import JSON_LAYOUT, LLGuidanceConstraint, LLGuidanceEngine  # noqa: E402
from specframe.target.hf import Target  # noqa: E402

from tests.fakes import BPE_EOS, build_bpe_model, build_bpe_tokenizer, live_server  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if tools %}tools: {{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}\n"
            "{% endif %}{% if add_generation_prompt %}assistant: {% endif %}")
MESSAGES = [{"role": "user", "content": '{"name": "Ada", "age": 36}'}]


def nested_object(levels: int) -> dict:
    """An object ``levels`` deep, each level's one required property the next (2 JSON levels per object level)."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def nested_array(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


TOO_DEEP = {"object-200": nested_object(200), "array-300": nested_array(300)}
UNSATISFIABLE = {
    "array-of-itself": {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    "object-requiring-itself": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
}


@pytest.fixture(scope="module")
def tok():
    t = build_bpe_tokenizer()
    t.chat_template = TEMPLATE
    return t


@pytest.fixture(scope="module")
def model(tok):
    return build_bpe_model(tok)


@pytest.fixture(scope="module")
def sf(tok, model):
    sf = specframe.load(target=Target(model, tok, name="tiny-bpe"), batch_size=2, max_new_tokens=16, chat=False)
    yield sf
    sf.close()


@pytest.fixture(scope="module")
def server(sf):
    from specframe.serve.app import create_app

    with live_server(create_app(sf, model_name="tiny-bpe", max_tokens_limit=64)) as url:
        yield url


def _one_line_error(r, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert "\n" not in err["message"], err
    return err


def _stream_events(r) -> list:
    return [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]


# --- 1. nested deeper than the engine reads ------------------------------------------------------------------------


def test_the_depth_limit_is_below_what_llguidance_and_pydantic_read(tok):
    """The limit leaves room: the deepest schema a request may send, wrapped as a tool call's answer, still compiles
    with llguidance (which stops at 124 levels) and serialises with pydantic (255)."""
    params = nested_array(MAX_SCHEMA_DEPTH - TOOL_WRAP_DEPTH - 1)
    assert schema_depth(params) == MAX_SCHEMA_DEPTH - TOOL_WRAP_DEPTH
    wrapped = {"anyOf": [{"type": "object", "properties": {"name": {"const": "f"}, "arguments": params},
                          "required": ["name", "arguments"]}, {"type": "null"}]}
    assert schema_depth(wrapped) == MAX_SCHEMA_DEPTH
    spec = ConstraintSpec(json_schema=wrapped)
    json.loads(spec.model_dump_json())
    LLGuidanceEngine(tok, len(tok), [BPE_EOS]).compile(spec)
    from llguidance import LLMatcher  # the engine's own margin above the limit

    engine = LLGuidanceEngine(tok, len(tok), [BPE_EOS])
    deeper = nested_array(MAX_SCHEMA_DEPTH + 20)  # 121 levels
    assert not LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(deeper, defaults=JSON_LAYOUT),
                                          engine.tokenizer)


@pytest.mark.parametrize("name", sorted(TOO_DEEP))
def test_schema_nested_too_deep_is_one_constraint_error(sf, tok, name):
    depth = schema_depth(TOO_DEEP[name])
    with pytest.raises(ConstraintError) as err:
        sf.generate_result(tok.encode("abc"), constraint={"json_schema": TOO_DEEP[name]})
    message = str(err.value)
    assert message == (f"constraint: json_schema: the schema nests {depth} levels of JSON objects and arrays; the "
                       f"limit is {MAX_SCHEMA_DEPTH} (specframe.contracts.constraint.MAX_SCHEMA_DEPTH): flatten it, "
                       "or use $defs and $ref")
    with pytest.raises(ConstraintError, match="nests"):  # a spec made in place, changed after: the engine checks too
        spec = ConstraintSpec(json_schema={"type": "object"})
        spec.json_schema["properties"] = {"a": TOO_DEEP[name]}
        sf.constraint(spec)


def test_schema_at_the_depth_limit_is_decoded(sf, tok):
    schema = nested_array(MAX_SCHEMA_DEPTH - 1)
    assert schema_depth(schema) == MAX_SCHEMA_DEPTH
    result = sf.generate_result(tok.encode("abc"), constraint={"json_schema": schema}, max_new_tokens=4)
    assert result.text.startswith("[") and len(result.token_ids) == 4


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", sorted(TOO_DEEP))
def test_schema_nested_too_deep_is_one_400(server, name, stream):
    schema = TOO_DEEP[name]
    fmt = {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"messages": MESSAGES, "max_tokens": 4, "response_format": fmt, "stream": stream})
    err = _one_line_error(r)
    assert err["param"] == "response_format.json_schema.schema"
    assert f"the schema nests {schema_depth(schema)} levels" in err["message"]
    assert f"the limit is {MAX_SCHEMA_DEPTH} (specframe.contracts.constraint.MAX_SCHEMA_DEPTH)" in err["message"]


@pytest.mark.parametrize("name", sorted(TOO_DEEP))
def test_tool_parameters_nested_too_deep_is_one_400(server, name):
    tool = {"type": "function", "function": {"name": "deep", "parameters": TOO_DEEP[name]}}
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"messages": MESSAGES, "max_tokens": 4, "tools": [tool], "tool_choice": "required"})
    err = _one_line_error(r)
    assert err["param"] == "tools.0.function.parameters"
    assert f"the limit is {MAX_SCHEMA_DEPTH - TOOL_WRAP_DEPTH} (MAX_SCHEMA_DEPTH {MAX_SCHEMA_DEPTH}" in err["message"]


def test_tool_parameters_at_their_limit_are_served(server):
    params = {"type": "object", "properties": {"a": nested_array(MAX_SCHEMA_DEPTH - TOOL_WRAP_DEPTH - 3)},
              "required": ["a"]}
    assert schema_depth(params) == MAX_SCHEMA_DEPTH - TOOL_WRAP_DEPTH
    tools = [{"type": "function", "function": {"name": n, "parameters": params}} for n in ("f", "g")]
    r = httpx.post(server + "/v1/chat/completions", timeout=120,
                   json={"messages": MESSAGES, "max_tokens": 4, "tools": tools, "tool_choice": "required"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"  # (4 tokens cannot finish a call that deep)


def test_schema_text_too_deep_for_the_json_reader_is_one_line(tmp_path):
    text = '{"type": "array", "items": ' + "[" * 5000 + "]" * 5000 + "}"
    with pytest.raises(ValueError, match="the schema nests deeper than Python's JSON reader goes; the limit is 100"):
        ConstraintSpec(json_schema=text)
    path = tmp_path / "deep.yaml"
    path.write_text('{"constraint": {"json_schema": ' + text + "}}")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: nests deeper than the YAML reader goes")


# --- 2. a schema no finite JSON satisfies --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(UNSATISFIABLE))
def test_unsatisfiable_schema_refused_before_decoding(sf, tok, name):
    """Refused when it compiles: submit raises at once, with no request handed to the batch loop."""
    with pytest.raises(ConstraintError) as err:
        sf.submit(tok.encode("abc"), constraint={"json_schema": UNSATISFIABLE[name]}, max_new_tokens=8)
    message = str(err.value)
    assert message.startswith("invalid json_schema: it admits no JSON value the grammar engine can write (llguidance: "
                              "after its first token, parser error: Too many items")
    assert message.endswith("a schema whose required part holds itself has no finite value (e.g. items {\"$ref\": "
                            "\"#\"} with minItems 1, or a required property referring to its own object): make that "
                            "part optional")
    assert "try avoiding" not in message  # (llguidance's advice on lexemes: not what to fix here)
    assert "\n" not in message and sf.pending == 0
    with pytest.raises(ConstraintError, match="admits no JSON value"):  # the same on the second try (cached grammar)
        sf.constraint({"json_schema": UNSATISFIABLE[name]})


def test_schema_admitting_nothing_at_its_first_mask_is_refused(sf):
    with pytest.raises(ConstraintError) as err:
        sf.constraint({"json_schema": {"$ref": "#"}})
    assert str(err.value).startswith("invalid json_schema: it admits no JSON value the grammar engine can write "
                                     "(llguidance: NoExtensionBias)")


def test_recursive_schemas_with_a_finite_value_still_compile(sf, tok):
    """The check refuses only what cannot start: a tree whose children may be empty, an optional self."""
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]}
    optional = {"type": "object", "properties": {"x": {"type": "integer"}, "a": {"$ref": "#"}}, "required": ["x"]}
    for schema in (tree, optional):
        assert sf.constraint({"json_schema": schema}) is not None
        LLGuidanceEngine.check(ConstraintSpec(json_schema=schema))
    result = sf.generate_result(tok.encode("abc"), constraint={"json_schema": tree}, max_new_tokens=24)
    assert result.text.startswith('{"kids": [')


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", sorted(UNSATISFIABLE))
def test_unsatisfiable_schema_is_one_400(server, name, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "self", "schema": UNSATISFIABLE[name]}}
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"messages": MESSAGES, "max_tokens": 8, "response_format": fmt, "stream": stream})
    err = _one_line_error(r)  # (streamed too: refused before the stream starts, not an error inside a 200)
    assert err["message"].startswith("invalid json_schema: it admits no JSON value the grammar engine can write")


def test_unsatisfiable_tool_parameters_are_one_400(server):
    tool = {"type": "function", "function": {"name": "self", "parameters": UNSATISFIABLE["object-requiring-itself"]}}
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"messages": MESSAGES, "max_tokens": 8, "tools": [tool], "tool_choice": "required"})
    assert "admits no JSON value" in _one_line_error(r)["message"]


def test_grammar_failing_while_decoding_is_one_line(tok):
    """What llguidance finds only while decoding (here: the unsatisfiable schema compiled without the check, its first
    token committed) is one line, not its parser-state dump."""
    from llguidance import LLMatcher

    engine = LLGuidanceEngine(tok, len(tok), [BPE_EOS])
    grammar = engine.grammar(ConstraintSpec(json_schema=UNSATISFIABLE["array-of-itself"]))
    constraint = LLGuidanceConstraint(LLMatcher(engine.tokenizer, grammar, log_level=0), len(tok), "json_schema",
                                      frozenset([BPE_EOS]))
    import torch

    empty = DraftTree.empty()
    constraint.mask(empty, torch.zeros(1, 1, len(tok)))
    with pytest.raises(ConstraintError) as err:
        constraint.commit(tok.encode("["))
    assert str(err.value).startswith("the json_schema constraint cannot go on: parser error: Too many items")
    assert "\n" not in str(err.value)
    with pytest.raises(ConstraintError, match="cannot go on") as err:
        constraint.mask(empty, torch.zeros(1, 1, len(tok)))
    assert "\n" not in str(err.value)


@pytest.fixture
def fails_at_the_second_step(monkeypatch):
    """Every constraint's mask fails at its second call, as llguidance does where it finds out only while decoding."""
    calls: dict[int, int] = {}
    real = LLGuidanceConstraint.mask

    def mask(self, draft, logits):
        calls[id(self)] = calls.get(id(self), 0) + 1
        if calls[id(self)] == 2:
            raise ConstraintError("the json_schema constraint cannot go on: parser error: Too many items")
        return real(self, draft, logits)

    monkeypatch.setattr(LLGuidanceConstraint, "mask", mask)


def test_constraint_failing_while_decoding_is_a_400(server, fails_at_the_second_step):
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"messages": MESSAGES, "max_tokens": 8, "response_format": {"type": "json_object"},
                         "speculative": {"proposers": ["none"]}})
    err = _one_line_error(r)
    assert err["message"] == "the json_schema constraint cannot go on: parser error: Too many items"


def test_constraint_failing_while_decoding_ends_the_stream_cleanly(server, fails_at_the_second_step):
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"messages": MESSAGES, "max_tokens": 8, "response_format": {"type": "json_object"},
                         "speculative": {"proposers": ["none"]}, "stream": True})
    assert r.status_code == 200  # (the stream had started)
    events = _stream_events(r)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error == {"message": "the json_schema constraint cannot go on: parser error: Too many items",
                     "type": "invalid_request_error", "param": None, "code": None}
    assert all("error" not in json.loads(e) for e in events[:-2])


# --- 3. the CLI and a config file ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tok, model):
    path = tmp_path_factory.mktemp("tiny-bpe")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("name", sorted(UNSATISFIABLE) + sorted(TOO_DEEP))
def test_cli_bad_schema_one_error_line(model_dir, tmp_path, name, monkeypatch):
    import specframe.api

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded: the schema should be refused before")

    monkeypatch.setattr(specframe.api, "load", no_load)
    schema = {**UNSATISFIABLE, **TOO_DEEP}[name]
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    result = CliRunner().invoke(cli.app, ["generate", "abc", "--model", str(model_dir), "--dtype", "float32",
                                              "--no-chat", "--max-new-tokens", "8", "--json-schema", str(path)])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stdout == "", result.output
    if name in UNSATISFIABLE:
        assert lines[0].startswith("error: config: constraint: invalid json_schema: it admits no JSON value")
    else:
        assert lines[0].startswith(f"error: config: constraint.json_schema: the schema nests {schema_depth(schema)} "
                                   f"levels of JSON objects and arrays; the limit is {MAX_SCHEMA_DEPTH}")


def test_cli_schema_file_too_deep_for_the_json_reader_one_error_line(tmp_path, monkeypatch):
    import specframe.api

    monkeypatch.setattr(specframe.api, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    path = tmp_path / "deep.json"
    path.write_text("[" * 5000 + "]" * 5000)
    result = CliRunner().invoke(cli.app, ["generate", "abc", "--json-schema", str(path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: --json-schema {path}: nests deeper than Python's JSON reader goes; "
                                          f"a schema may nest at most {MAX_SCHEMA_DEPTH} levels "
                                          "(specframe.contracts.constraint.MAX_SCHEMA_DEPTH)"]


@pytest.mark.parametrize("name", sorted(UNSATISFIABLE))
def test_config_unsatisfiable_constraint_caught_at_load_config(tmp_path, name):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"constraint": {"json_schema": UNSATISFIABLE[name]}}))
    with pytest.raises(ConstraintError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: constraint: invalid json_schema: it admits no JSON value")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", sorted(TOO_DEEP))
def test_config_constraint_nested_too_deep_caught_at_load_config(tmp_path, name):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"constraint": {"json_schema": TOO_DEEP[name]}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: constraint.json_schema: the schema nests {schema_depth(TOO_DEEP[name])} "
                              f"levels of JSON objects and arrays; the limit is {MAX_SCHEMA_DEPTH} "
                              "(specframe.contracts.constraint.MAX_SCHEMA_DEPTH): flatten it, or use $defs and $ref")


def test_config_good_constraint_still_loads(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("constraint:\n  json_schema:\n    type: object\n    properties: {name: {type: string}}\n"
                    "    required: [name]\n")
    cfg = load_config(path)
    assert cfg.constraint.json_schema["required"] == ["name"]
