"""Issue 65 ("10 more report kinds from peers' trackers on what this round touches, each a test"): structured output
and its limits, logprobs and characters split over tokens, stops, tools, hybrid targets and config types, each test
named after a kind that peers' users reported (the source is in its docstring, as repository + issue/PR number):

1. max_tokens ending inside a character: non-streamed text = joined stream (passed as it was);
2. streamed pieces of split characters under speculation join to the answer (passed);
3. deeply nested JSON: a 400, the server up (an earlier call's arguments 900 deep were a 500: refused, naming the
   limit);
4. chat logprobs ``bytes`` are each token's own and join to the content (a SentencePiece word start lost its space);
5. chat ``top_logprobs`` of partial tokens keep distinct spellings (all were "\ufffd");
6. a ``tool`` message that answers no call is OpenAI's 400 (it was served);
7. ``strict`` of the wrong type is a 400 naming it (passed);
8. a tool array parameter without ``items`` is served (passed);
9. invalid UTF-8 from the model, token prompts starting mid-character: never a 500 (passed);
10. streamed stop = non-streamed stop under speculation (passed);
11. a hybrid target's stops and logprobs under speculation equal decoding without it (passed);
12. a config number given as a string or bool is one line naming the field (it was read as a number).

The servers are the tests' tiny models: the scripted "fire" target of test_reports_round6_characters (its greedy
answer is a fixed cycle of tokens that split a character: 🔥 over SmolLM2's tokenizer and the tests' byte-level BPE,
日語 over a SentencePiece-style byte-fallback one), the word-level tiny llama of test_serve, the byte-level BPE model
of test_serve_structured, and a tiny hybrid (Qwen3-Next: gated-delta linear attention beside full attention).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

import specframe  # noqa: E402
from specframe.decode.stopping import emitted_text  # noqa: E402
from specframe.serve.structured import _token_bytes  # noqa: E402
from specframe.target.hf import Target  # noqa: E402

from tests.faces.test_reports_round6_characters import FIRE, _case, scripted_target  # noqa: E402
from tests.fakes import build_bpe_model, build_bpe_tokenizer, build_model, build_tokenizer, live_server  # noqa: E402

# the chat turn ends in the word the scripted targets answer after ("fire"): their answer depends on it alone
CHARS_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}fire{% endif %}")
WORD_TEMPLATE = ("{% for m in messages %}{{ 'aa ' if m['role'] == 'user' else 'ab ' }}{{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}ac{% endif %}")
BPE_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if tools %}tools: {{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}\n"
                "{% endif %}{% if add_generation_prompt %}assistant: {% endif %}")


# --- helpers ----------------------------------------------------------------------------------------------------------


def _path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


def _body(chat: bool, prompt, **body) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], **body} if chat else {"prompt": prompt, **body}


def _whole(url: str, chat: bool, body: dict) -> dict:
    """The non-streamed answer: {text, finish, logprobs, usage}."""
    r = httpx.post(url + _path(chat), json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    return {"text": text, "finish": choice["finish_reason"], "logprobs": choice["logprobs"], "usage": data["usage"]}


def _stream(url: str, chat: bool, body: dict) -> dict:
    """The streamed answer: {pieces, text, finish, logprobs, usage} (chat logprobs' content lists joined)."""
    pieces, finish, logprobs, usage = [], None, None, None
    with httpx.stream("POST", url + _path(chat), json={**body, "stream": True}, timeout=120) as s:
        assert s.status_code == 200, s.read()
        for line in s.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                piece = (choice["delta"].get("content") if chat else choice["text"]) or ""
                if piece:
                    pieces.append(piece)
                finish = choice["finish_reason"] or finish
                if choice["logprobs"]:
                    if chat:
                        logprobs = {"content": (logprobs or {"content": []})["content"] + choice["logprobs"]["content"]}
                    else:
                        logprobs = choice["logprobs"]
    return {"pieces": pieces, "text": "".join(pieces), "finish": finish, "logprobs": logprobs, "usage": usage}


def _alive(url: str) -> None:
    assert httpx.get(url + "/health", timeout=30).json()["status"] == "ok"


# --- servers ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["smollm2", "bpe", "byte-fallback"])
def chars(request):
    """(case, Specframe, URL, chat prompt ids): the scripted fire target over one tokenizer, with a chat template."""
    case = _case(request.param)
    case.tok.chat_template = CHARS_TEMPLATE
    chat_ids = case.tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
    assert chat_ids[-1] == case.prompt[-1]  # so its answer is the cycle
    sf = specframe.load(target=case.target, batch_size=4, max_new_tokens=64)
    from specframe.serve.app import create_app

    try:
        with live_server(create_app(sf, model_name="scripted-chars", max_tokens_limit=64)) as url:
            yield case, sf, url, list(chat_ids)
    finally:
        sf.close()


@pytest.fixture(scope="module")
def words():
    """(Specframe, URL) over test_serve's word-level tiny llama (whose answers repeat: ngram drafts get accepted)."""
    tok = build_tokenizer()
    tok.chat_template = WORD_TEMPLATE
    sf = specframe.load(target=Target(build_model("llama", initializer_range=0.2), tok, name="tiny"), batch_size=4,
                        max_new_tokens=24)
    from specframe.serve.app import create_app

    try:
        with live_server(create_app(sf, model_name="tiny", max_tokens_limit=64)) as url:
            yield sf, url
    finally:
        sf.close()


@pytest.fixture(scope="module")
def bpe():
    """(Specframe, URL) over test_serve_structured's byte-level BPE model (EOS id 0; tools in its chat template)."""
    tok = build_bpe_tokenizer()
    tok.chat_template = BPE_TEMPLATE
    sf = specframe.load(target=Target(build_bpe_model(tok), tok, name="tiny-bpe"), batch_size=4, max_new_tokens=40)
    from specframe.serve.app import create_app

    try:
        with live_server(create_app(sf, model_name="tiny-bpe", max_tokens_limit=64)) as url:
            yield sf, url
    finally:
        sf.close()


# --- 1. max_tokens ends the answer inside a character -----------------------------------------------------------------


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_max_tokens_inside_a_character_non_streamed_equals_the_stream(chars, chat):
    """kekzl/imp #1310 (fixed by #1323), antirez/ds4 #815: when max_tokens cut the answer inside a multi-byte
    character, the non-streamed text ended in U+FFFD (or invalid UTF-8) while the stream held the half character
    back, so the two transports disagreed. Every cut point, both endpoints: the non-streamed text, the joined stream
    and the Python API's text are one string, without U+FFFD, the cut character left out."""
    case, sf, url, chat_ids = chars
    prompt = chat_ids if chat else case.prompt
    for n in range(1, 2 * case.per_unit + 1):
        want = sf.generate_result(prompt, proposers=["none"], max_new_tokens=n)
        assert want.text == emitted_text(case.target.decode, (case.cycle * 2)[:n]) and "\ufffd" not in want.text
        body = _body(chat, "hi" if chat else "fire", max_tokens=n)
        whole, streamed = _whole(url, chat, body), _stream(url, chat, body)
        assert (whole["text"], whole["finish"]) == (want.text, "length"), n
        assert (streamed["text"], streamed["finish"]) == (want.text, "length"), n
        assert whole["usage"]["completion_tokens"] == streamed["usage"]["completion_tokens"] == n


# --- 2. streamed pieces with split characters, under speculation ------------------------------------------------------


@pytest.mark.parametrize("proposers", [["ngram"], ["lookahead"], ["ngram", "lookahead"]], ids="+".join)
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_streamed_pieces_of_split_characters_join_to_the_answer_under_speculation(chars, chat, proposers):
    """leonickson1/Swiftlet #7, mattn/tensai #110: a streamed delta that showed the U+FFFD of a half character made
    the later text no longer a prefix of what was sent, so the stream stalled (or sent text twice). With drafts
    accepted several tokens at a time (a block may end inside a character), every piece is whole text and the
    pieces join to the non-streamed answer, which is the answer without speculation."""
    case, sf, url, chat_ids = chars
    n = 3 * case.per_unit + 1  # three turns of the cycle and the first token of a fourth: ends inside a character
    want = sf.generate_result(chat_ids if chat else case.prompt, proposers=["none"], max_new_tokens=n)
    # (an untimed router: a timed one may find on a busy machine that drafting does not pay, and draft nothing)
    body = _body(chat, "hi" if chat else "fire", max_tokens=n, speculative={
        "proposers": proposers, **({"router": {"name": "adaptive", "measure": "never"}} if len(proposers) > 1 else {})})
    streamed, whole = _stream(url, chat, body), _whole(url, chat, body)
    assert streamed["text"] == whole["text"] == want.text and whole["finish"] == streamed["finish"] == "length"
    assert all(p and "\ufffd" not in p for p in streamed["pieces"]), streamed["pieces"]
    assert streamed["usage"]["speculation"]["accepted_nodes"] > 0  # drafts were accepted: blocks of tokens


# --- 3. deeply nested JSON in the body --------------------------------------------------------------------------------

DEEP = 100_000  # levels: far past Python's recursion limit (json.loads raises RecursionError near 1000 levels)


def _deep(levels: int) -> str:
    return "[" * levels + "0" + "]" * levels


def _nested_body(chat: bool, where: str, levels: int) -> str:
    deep = _deep(levels)
    if where == "tool call":  # an earlier assistant call's arguments (only chat messages carry them)
        return ('{"messages": [{"role": "user", "content": "ba"}, {"role": "assistant", "tool_calls": [{"id": "c", '
                '"type": "function", "function": {"name": "f", "arguments": ' + deep + '}}]}, {"role": "tool", '
                '"tool_call_id": "c", "content": "bb"}], "max_tokens": 4}')
    head = ('{"messages": [{"role": "user", "content": "ba bb"}], ' if chat else '{"prompt": "ba bb", ') + \
        '"max_tokens": 4, '
    return head + {
        "unknown field": f'"x": {deep}}}',
        "proposer option": f'"speculative": {{"proposers": [{{"name": "ngram", "k": {deep}}}]}}}}',
        "schema": f'"response_format": {{"type": "json_schema", "json_schema": {{"name": "n", "schema": '
                  f'{{"type": "object", "x": {deep}}}}}}}}}',
    }[where]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("where", ["unknown field", "proposer option", "schema", "tool call"])
def test_deeply_nested_json_is_a_400_and_the_server_stays_up(words, bpe, chat, where):
    """antirez/ds4 #43, flop-labs/technocore-chat #130: a body nesting arrays thousands deep (in a field the server
    skips or ignores) overflowed the parser's recursion: the server died, or answered 500. Each place a request
    carries free-form JSON, 100 000 levels deep: a 400 with OpenAI's error object, and the server answers the next
    request. 900 levels, which the parser reads, get the field's own 400; an earlier call's arguments that deep
    were a 500 (transformers' chat template walks messages recursively): now a 400 naming the limit."""
    if where == "tool call" and not chat:
        pytest.skip("completions carry no messages")
    _, url = bpe if where == "schema" else words
    for levels in (DEEP, 900):
        r = httpx.post(url + _path(chat), content=_nested_body(chat, where, levels),
                       headers={"content-type": "application/json"}, timeout=120)
        assert r.status_code == 400, (levels, r.text[:300])
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and "\n" not in err["message"], err
        if levels == DEEP:
            assert "body" in err["message"], err
        elif where == "tool call":
            assert err["param"] == "messages.1.tool_calls" and "nest" in err["message"] and "100" in err["message"]
        _alive(url)
    assert _whole(url, chat, _body(chat, "ba bb", max_tokens=2))["finish"] == "length"


# --- 4, 5. chat logprobs of tokens that hold part of a character ------------------------------------------------------


def _escaped(raw: bytes) -> str:
    return "".join(f"\\x{b:02x}" for b in raw)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_logprobs_bytes_of_partial_character_tokens_are_the_tokens_own(chars, stream):
    """ollama/ollama #13497 (#13500, #14692): chat logprobs gave every token holding part of a UTF-8 character the
    bytes of U+FFFD, [239, 191, 189], instead of its own ([240]...), so a client could not join them into the text.
    Each entry's bytes are its token's own, the entries' bytes join to the content's UTF-8 (word-start spaces of a
    SentencePiece vocabulary included), and no alternative carries U+FFFD's bytes."""
    case, sf, url, _ = chars
    n = 2 * case.per_unit
    body = _body(True, "hi", max_tokens=n, logprobs=True, top_logprobs=5)
    got = (_stream if stream else _whole)(url, True, body)
    content = got["logprobs"]["content"]
    assert got["text"] == case.answer and len(content) == n
    assert b"".join(bytes(e["bytes"]) for e in content) == got["text"].encode("utf-8")
    for i, entry in enumerate(content):
        token = case.cycle[i % case.per_unit]
        if "\ufffd" in case.tok.decode([token]):  # a token holding part of a character: its own bytes
            assert bytes(entry["bytes"]) == bytes(_token_bytes(case.tok, token, "\ufffd")) != "\ufffd".encode()
        alternatives = entry["top_logprobs"][1:]
        assert len(alternatives) == 4 and entry["top_logprobs"][0]["bytes"] == entry["bytes"]
        for alt, token in zip(alternatives, case.alternatives):
            assert alt["bytes"] == _token_bytes(case.tok, token, case.tok.decode([token])) != [239, 191, 189]


def test_chat_top_logprobs_of_partial_tokens_are_distinct_spellings(chars):
    """vllm-project/vllm #27300 (fixed for the legacy form by #34875): with top_logprobs > 0, tokens holding part of
    a character came back as empty strings or garbage; in specframe's chat form every such alternative was "\ufffd",
    so a client keying alternatives by ``token`` (the usual ``{t.token: t.logprob}``) kept one of 5. Each ``token``
    is the text the token adds when it holds whole characters, else its bytes escaped as ``\\xNN`` (as DeepSeek's chat
    API writes them, standardcompletions/rfcs #2): distinct tokens, distinct spellings; ``bytes`` agree with it."""
    case, sf, url, _ = chars
    n = 2 * case.per_unit
    got = _whole(url, True, _body(True, "hi", max_tokens=n, logprobs=True, top_logprobs=5))
    for entry in got["logprobs"]["content"]:
        spellings = [t["token"] for t in entry["top_logprobs"]]
        assert len(set(spellings)) == len(spellings) == 5, spellings
        for t in [entry, *entry["top_logprobs"]]:
            raw = bytes(t["bytes"])
            assert "\ufffd" not in t["token"], t
            assert t["token"] == (raw.decode("utf-8") if _whole_text(raw) else _escaped(raw)), t
    # the chosen tokens' spellings: a partial token's bytes escaped; the one completing a character, its own bytes
    if case.name == "bpe":
        assert [e["token"] for e in got["logprobs"]["content"][:4]] == [_escaped(bytes([b])) for b in FIRE.encode()]


def _whole_text(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --- 6. a tool message that answers no call ---------------------------------------------------------------------------

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize("messages, index", [
    ([{"role": "user", "content": "ba"}, {"role": "tool", "tool_call_id": "call_1", "content": "bb"}], 1),
    ([{"role": "tool", "tool_call_id": "call_1", "content": "bb"}], 0),
    ([{"role": "user", "content": "ba"}, {"role": "assistant", "content": "bb"},
      {"role": "tool", "tool_call_id": "call_1", "content": "bc"}], 2),
    ([{"role": "user", "content": "ba"}, {"role": "assistant", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "bb"}, {"role": "user", "content": "bc"},
      {"role": "tool", "tool_call_id": "call_1", "content": "bd"}], 4),
])
def test_a_tool_message_without_a_preceding_tool_call_is_a_400(words, messages, index):
    """smarter-sh/smarter #264, FoundationAgents/OpenManus #744, qwersyk/Newelle #425: OpenAI answers a ``tool``
    message that follows no assistant message with ``tool_calls`` with a 400, "messages with role 'tool' must be a
    response to a preceeding message with 'tool_calls'", param ``messages.[i].role``; specframe passed it to the
    chat template and answered 200 (a conversation the model was never trained to continue). Now the same 400; a
    tool message after the call it answers (and after other answers to the same call) is served."""
    _, url = words
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "must be a response to a preceding message with 'tool_calls'" in err["message"], err
    assert err["param"] == f"messages.[{index}].role" and err["type"] == "invalid_request_error", err
    ok = [{"role": "user", "content": "ba"}, {"role": "assistant", "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "bb"},
          {"role": "tool", "tool_call_id": "call_2", "content": "bc"}]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": ok, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_tool_message_answering_an_unknown_call_id_is_a_400(words):
    """The same reports' other half: a tool message answers one of the calls it follows; one whose tool_call_id is
    none of their ids is a 400 naming both (it was served, the answer attached to no call)."""
    _, url = words
    messages = [{"role": "user", "content": "ba"}, {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_9", "content": "bb"}]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "call_9" in err["message"] and "call_1" in err["message"] and err["param"] == "messages.[2].tool_call_id"


# --- 7. strict of the wrong type --------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
    "additionalProperties": False}}}


@pytest.mark.parametrize("value", ["maybe", 5, [True], {"on": True}])
@pytest.mark.parametrize("field", ["tools", "response_format"])
def test_strict_of_the_wrong_type_is_a_400_naming_the_field(bpe, field, value):
    """ogx-ai/ogx #4617 (#4795): OpenAI answers ``strict`` that is not a boolean with a 400 naming the field
    (``tools.0.function.strict``); a server that forwards or drops it serves a request the client believes strict.
    Both places a request carries ``strict``: a 400 with OpenAI's error object naming it; ``true``, ``false`` and
    null (left out) are served."""
    _, url = bpe
    messages = [{"role": "user", "content": '{"city": "Paris"}'}]
    if field == "tools":
        def body(strict):
            return {"messages": messages, "max_tokens": 24, "tool_choice": "required",
                    "tools": [{**WEATHER, "function": {**WEATHER["function"], "strict": strict}}]}
        param = "tools.0.function.strict"
    else:
        def body(strict):
            return {"messages": messages, "max_tokens": 24, "response_format": {"type": "json_schema", "json_schema": {
                "name": "city", "strict": strict, "schema": WEATHER["function"]["parameters"]}}}
        param = "response_format.json_schema.strict"
    r = httpx.post(url + "/v1/chat/completions", json=body(value), timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"] and "boolean" in err["message"], err
    for ok in (True, False, None):
        r = httpx.post(url + "/v1/chat/completions", json=body(ok), timeout=120)
        assert r.status_code == 200, r.text


# --- 8. an array parameter without items ------------------------------------------------------------------------------

TAGS = {"type": "function", "function": {"name": "tag", "parameters": {
    "type": "object", "properties": {"tags": {"type": "array", "maxItems": 3}}, "required": ["tags"],
    "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_tool_array_parameter_without_items_is_served(bpe, choice, stream):
    """nhost/nhost #3686, shaun0927/openchrome #1475, codexu/note-gen #1227: tools whose array parameters had no
    ``items`` (valid JSON Schema: any items) were refused ("tool parameters array type must have items") or broke
    the chat template with a 500. Here such a tool is served, named or required, whole or streamed: the call's
    arguments hold an array (of any items) and validate against the parameters."""
    _, url = bpe
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "tag"}}
    body = {"messages": [{"role": "user", "content": '{"tags": ["x", "y"]}'}], "max_tokens": 48, "tools": [TAGS],
            "tool_choice": tool_choice}
    if stream:
        calls, finish = {}, None
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for c in json.loads(line[6:])["choices"]:
                        for call in c["delta"].get("tool_calls") or []:
                            calls.setdefault(call["index"], call["function"])
                        finish = c["finish_reason"] or finish
        function = calls[0]
    else:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice_ = r.json()["choices"][0]
        finish, function = choice_["finish_reason"], choice_["message"]["tool_calls"][0]["function"]
    assert finish == "tool_calls" and function["name"] == "tag"
    arguments = json.loads(function["arguments"])
    jsonschema.validate(arguments, TAGS["function"]["parameters"])
    assert isinstance(arguments["tags"], list)


# --- 9. invalid UTF-8: a prompt that starts inside a character, an answer of stray bytes ------------------------------


@pytest.fixture(scope="module")
def stray():
    """(tokenizer, Specframe, URL, cycle): a scripted target over the byte-level BPE whose greedy answer repeats
    ``\\x9f a \\x94 \\xa5 b``: continuation bytes no lead byte began (invalid UTF-8), between ASCII letters."""
    from specframe.serve.structured import _BYTES

    tok = build_bpe_tokenizer()
    char_of = {b: c for c, b in _BYTES.items()}
    cycle = [tok.convert_tokens_to_ids(char_of[b]) for b in (0x9F, ord("a"), 0x94, 0xA5, ord("b"))]
    target, _ = scripted_target(tok, tok.encode("fire", add_special_tokens=False), cycle)
    sf = specframe.load(target=target, batch_size=4, max_new_tokens=64)
    from specframe.serve.app import create_app

    try:
        with live_server(create_app(sf, model_name="stray", max_tokens_limit=64)) as url:
            yield tok, sf, url, cycle
    finally:
        sf.close()


def test_invalid_utf8_from_the_model_is_never_a_500(stray):
    """unslothai/llama.cpp #202, Neroued/ninfer #104, ggml-org/llama.cpp #28724: a model that emitted bytes which are
    not UTF-8 (a stray continuation byte) ended the request with a 500 ("does not match the expected format",
    "invalid UTF-8 continuation byte"), and sometimes the engine.
    Every cut point, whole and streamed, with and without speculation: 200, stray bytes shown as U+FFFD once later
    text follows them, the stream equal to the whole answer and to the Python API's."""
    tok, sf, url, cycle = stray
    prompt = tok.encode("fire", add_special_tokens=False)
    for n in range(1, 11):
        want = sf.generate_result(prompt, proposers=["none"], max_new_tokens=n)
        body = {"prompt": prompt, "max_tokens": n, "logprobs": 1}
        whole, streamed = _whole(url, False, body), _stream(url, False, body)
        assert whole["text"] == streamed["text"] == want.text, n
        assert len(whole["logprobs"]["tokens"]) == n and "".join(whole["logprobs"]["tokens"]) == whole["text"]
        for spec in (["ngram"], ["lookahead"]):
            got = _whole(url, False, {**body, "speculative": {"proposers": spec}})
            assert got["text"] == want.text, (n, spec)
    assert _whole(url, False, {"prompt": prompt, "max_tokens": 10})["text"] == "\ufffda\ufffd\ufffdb" * 2


def test_a_token_prompt_that_begins_inside_a_character_is_answered(chars):
    """unslothai/llama.cpp #202 (its second report: prompts built as windows of token ids often begin on a byte
    token inside a character, and every such request was a 500): ids that begin with a character's later bytes are
    a prompt like any other."""
    case, _, curl, _ = chars
    ids = case.cycle[1:] + case.prompt  # the character's first token left out
    got = _whole(curl, False, {"prompt": ids, "max_tokens": 2 * case.per_unit})
    assert got["text"] == case.answer and got["usage"]["prompt_tokens"] == len(ids)


# --- 10. stop strings on the streaming path, under speculation --------------------------------------------------------

PROMPTS = ["ba bb bc ba bb bd", "ca cb cc cd ca cb", "fa fb fc fa fb fc fa"]


@pytest.mark.parametrize("proposers", [["ngram"], ["lookahead"], ["ngram", "lookahead"]], ids="+".join)
def test_streamed_stop_equals_non_streamed_stop_under_speculation(words, proposers):
    """paiml/aprender #2019: the streaming handler ignored ``stop``, so the streamed message kept the stop string and
    ran to max_tokens while the non-streamed one stopped. Stop strings taken from each answer's own text (one word,
    two words, a word's first letter), speculation drafting past them: streamed and non-streamed texts, finish
    reasons and token counts are equal, and equal to decoding without speculation (text cut before the stop)."""
    sf, url = words
    accepted = 0
    for prompt in PROMPTS:
        free = sf.generate_result(prompt, proposers=["none"], max_new_tokens=20, chat=False).text.split(" ")
        for stop in (free[4], " ".join(free[6:8]), free[9][0]):
            want = sf.generate_result(prompt, proposers=["none"], max_new_tokens=20, chat=False, stop=[stop])
            assert want.finish_reason == "stop" and stop not in want.text
            body = {"prompt": prompt, "max_tokens": 20, "stop": [stop], "speculative": {"proposers": proposers}}
            whole, streamed = _whole(url, False, body), _stream(url, False, body)
            assert whole["text"] == streamed["text"] == want.text, (prompt, stop)
            assert whole["finish"] == streamed["finish"] == "stop"
            assert whole["usage"]["completion_tokens"] == streamed["usage"]["completion_tokens"] == \
                len(want.token_ids)
            accepted += whole["usage"]["speculation"]["accepted_nodes"]
    assert accepted > 0  # drafts were accepted, so blocks of several tokens reached the stop


# --- 11. a hybrid target: stops and logprobs --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid():
    """(Specframe, URL) over a tiny random Qwen3-Next (gated-delta linear attention beside full attention: recurrent state
    rolled back after each rejected draft) with the word-level tokenizer."""
    from specframe.target.state_target import make_target
    from specframe.testing.decoder_types import build_tiny

    sf = specframe.load(target=make_target(build_tiny("qwen3_next", seed=0), build_tokenizer(), name="hybrid"),
                        batch_size=4, max_new_tokens=24)
    from specframe.serve.app import create_app

    try:
        with live_server(create_app(sf, model_name="hybrid", max_tokens_limit=64)) as url:
            yield sf, url
    finally:
        sf.close()


@pytest.mark.parametrize("proposers", [["ngram"], ["ngram", "lookahead"]], ids="+".join)
def test_hybrid_target_stops_and_logprobs_equal_decoding_without_speculation(hybrid, proposers):
    """vllm-project/vllm #39273 (#52942): ngram speculation on a hybrid GDN model (Qwen3.5 / Qwen3-Next) corrupted
    greedy output: a step that accepted drafts followed by a step ngram left without drafts read a stale recurrent
    state. On a target whose linear-attention state is rolled back after each rejected draft, a request with a stop
    string and logprobs gives, streamed and not, the text, finish, tokens and log-probabilities (float32, 1e-4) of
    the same request decoded without speculation."""
    sf, url = hybrid
    accepted = 0
    for prompt in PROMPTS:
        free = sf.generate_result(prompt, proposers=["none"], max_new_tokens=30, chat=False).text.split(" ")
        stop = " ".join(free[14:20])  # (its answers repeat after ~10 words: drafts get accepted before the stop)
        base = {"prompt": prompt, "max_tokens": 30, "stop": [stop], "logprobs": 3}
        want = _whole(url, False, {**base, "speculative": {"proposers": ["none"]}})
        assert want["finish"] == "stop" and stop not in want["text"]
        # (an untimed router: a timed one may find on a busy machine that drafting does not pay, and draft nothing)
        body = {**base, "speculative": {"proposers": proposers, **(
            {"router": {"name": "adaptive", "measure": "never"}} if len(proposers) > 1 else {})}}
        for got in (_whole(url, False, body), _stream(url, False, body)):
            assert (got["text"], got["finish"]) == (want["text"], want["finish"]), (prompt, stop)
            lp, wlp = got["logprobs"], want["logprobs"]
            assert lp["tokens"] == wlp["tokens"] and lp["text_offset"] == wlp["text_offset"]
            assert lp["token_logprobs"] == pytest.approx(wlp["token_logprobs"], abs=1e-4)
            for d, w in zip(lp["top_logprobs"], wlp["top_logprobs"]):
                assert list(d) == list(w) and list(d.values()) == pytest.approx(list(w.values()), abs=1e-4)
        accepted += got["usage"]["speculation"]["accepted_nodes"]
    assert accepted > 0


# --- 12. config values of the wrong type ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, field", [
    ('proposers: [{name: ngram, k: "5"}]\n', "k"),
    ("proposers: [{name: ngram, k: yes}]\n", "k"),  # YAML 1.1: yes is true, and true was read as 1
    ("proposers: [{name: ngram, k: 5.5}]\n", "k"),
    ("proposers: [{name: ngram, k: [5]}]\n", "k"),
    ("proposers: [{name: ngram, min_n: true}]\n", "min_n"),
    ('proposers: [ngram, lookahead]\nmerge: {name: priority, max_nodes: "16"}\n', "max_nodes"),
    ("proposers: [ngram, lookahead]\nmerge: {name: priority, max_nodes: on}\n", "max_nodes"),
    ('batch_size: "4"\n', "batch_size"),
    ("batch_size: true\n", "batch_size"),
    ("proposers: {name: ngram}\n", "proposers"),
    ("sampling: [0.5]\n", "sampling"),
])
def test_a_config_value_of_the_wrong_type_is_one_line_naming_the_field(tmp_path, text, field):
    """23andMe/Yamale #109, pydantic/pydantic #579: a YAML value of the wrong type was read as another (``k: yes``,
    YAML's true, became k = 1; ``k: "5"`` became 5) — the run used a setting nobody wrote. As ``max_new_tokens``,
    ``seed`` and ``threads`` already were: a bool or a string where a number goes, a fraction where a whole number
    goes, a list where a mapping goes, is one error line naming the field (and the file)."""
    from specframe.config import load_config
    from specframe.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message and f"{field}:" in message, message
    good = text.replace('"5"', "5").replace("yes", "5").replace("5.5", "5").replace("[5]", "5").replace(
        "true", "1").replace('"16"', "16").replace("on}", "16}").replace('"4"', "4")
    if field not in ("proposers", "sampling"):  # the same file with the value as its type: loads
        path.write_text(good)
        load_config(path)


def test_a_request_proposer_option_of_the_wrong_type_is_a_400(words):
    """The same through the server: a request's ``speculative`` proposer option of the wrong type is a 400 naming it,
    not a run with another value."""
    _, url = words
    for k in ("5", True):
        r = httpx.post(url + "/v1/completions", json={"prompt": "ba bb", "max_tokens": 2, "speculative": {
            "proposers": [{"name": "ngram", "k": k}]}}, timeout=60)
        assert r.status_code == 400 and "k:" in r.json()["error"]["message"], r.text
