"""A reasoning model through specframe serve (issue 68, must-show d): a tiny random Qwen3 model with Qwen3's own chat
template (tests/faces/data/qwen3_chat_template.jinja) and Qwen3's vocabulary markers as single tokens. A bigram
script (a logit bias on the next token of each scripted token) makes it think first: ``<think>`` three words
``</think>``, then answer. Detected from the template: the ``qwen3`` reasoning parser and the ``hermes`` tool parser.
The reasoning comes back apart (``reasoning_content``), streamed and not; a ``response_format`` schema is enforced
only after ``</think>``; with ngram drafting the reasoning's end and the answer's first forced tokens from the prompt,
the end of the reasoning falls inside one accepted draft, and the output is token-identical to plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

import specframe  # noqa: E402
from specframe.target.hf import Target  # noqa: E402

from tests.fakes import build_bpe_tokenizer, live_server  # noqa: E402

TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"],
        "additionalProperties": False}
# the user's message holds the scripted reasoning's last words, its end and the answer's start: ngram drafts them
USER = 'Think, then answer as JSON. Example: false null true</think>{"city": "Paris"}'
WORDS = "false null true"


def _scripted_qwen3():
    """(tokenizer, model, the scripted reasoning's token ids): Qwen3's markers as single tokens, a tiny random Qwen3
    whose LM head adds 40 to the scripted successor of ``<|im_start|>assistant\\n``'s last token, ``<think>`` and the
    three words."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_bpe_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>"])  # (Qwen3: added, not special)
    tok.chat_template = TEMPLATE
    torch.manual_seed(5)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    model = Qwen3ForCausalLM(cfg).float().eval()
    model.generation_config.eos_token_id = 0
    model.generation_config.pad_token_id = 0
    words = tok.encode(" " + WORDS, add_special_tokens=False)
    user_ids = tok.encode(USER, add_special_tokens=False)
    assert any(user_ids[i:i + len(words)] == words for i in range(len(user_ids))), "the words tokenize alike"
    start = tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=True,
                                    return_dict=True)["input_ids"][-1]
    think, end = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    script = [start, think, *words, end]
    assert len(set(script)) == len(script)
    successor = {a: b for a, b in zip(script, script[1:])}
    seen: dict[str, torch.Tensor] = {}

    def keep_ids(module, args, kwargs):
        seen["ids"] = kwargs.get("input_ids", args[0] if args else None)

    def scripted(module, args, out):
        ids = seen["ids"][:, -out.shape[1]:]  # (a prefill keeps the last position's logits only)
        bias = torch.zeros_like(out)
        for (b, i), t in zip(torch.cartesian_prod(torch.arange(ids.shape[0]), torch.arange(ids.shape[1])).tolist(),
                             ids.flatten().tolist()):
            if t in successor:
                bias[b, i, successor[t]] = 40.0
        return out + bias

    model.register_forward_pre_hook(keep_ids, with_kwargs=True)
    model.lm_head.register_forward_hook(scripted)
    return tok, model, script


@pytest.fixture(scope="module")
def qwen3():
    tok, model, script = _scripted_qwen3()
    from specframe.serve.app import create_app

    sf = specframe.load(target=Target(model, tok, name="tiny-qwen3"), batch_size=2, max_new_tokens=32)
    app = create_app(sf, model_name="tiny-qwen3", max_tokens_limit=64)
    assert (app.state.formats.tool.name, app.state.formats.reasoning.name) == ("hermes", "qwen3")
    with live_server(app) as url:
        yield sf, url, tok, script
    sf.close()


def _chat(url, stream, proposers, **kw):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    kwargs = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": USER}], "max_tokens": 24,
              "extra_body": {"speculative": {"proposers": proposers}}, **kw}
    if not stream:
        m = client.chat.completions.create(**kwargs).choices[0].message
        return getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content"), m.content
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for ch in chunk.choices:
            extra = ch.delta.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
            content += ch.delta.content or ""
    return reasoning or None, content or None


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_comes_back_apart(qwen3, stream):
    _, url, _, _ = qwen3
    reasoning, content = _chat(url, stream, ["none"])
    assert reasoning.strip() == WORDS, reasoning
    assert not (content or "").startswith("</think>")
    assert _chat(url, stream, ["ngram"]) == (reasoning, content)


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_holds_only_after_the_reasoning(qwen3, stream):
    _, url, _, _ = qwen3
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    reasoning, content = _chat(url, stream, ["none"], response_format=fmt, max_tokens=40)
    assert reasoning.strip() == WORDS  # the free reasoning: the schema did not apply to it
    jsonschema.validate(json.loads(content), CITY)
    assert _chat(url, stream, ["ngram", "grammar"], response_format=fmt, max_tokens=40) == (reasoning, content)


def test_the_end_of_the_reasoning_inside_an_accepted_draft(qwen3):
    """ngram drafts `` true </think> {"city": ...`` from the prompt; the step that accepts it crosses the end of the
    reasoning, so the constraint (JSON after ``</think>``) judges the rest of that same draft. Token-identical to plain
    decoding, and one step's committed text holds the end marker and the answer's start."""
    from specframe.serve.schemas import ChatRequest
    from specframe.serve.tool_calling import Formats, plan

    sf, _, tok, script = qwen3
    body = ChatRequest.model_validate({"messages": [{"role": "user", "content": USER}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}})
    p = plan(body, Formats.choose(sf.registry, TEMPLATE), added=tok.get_added_vocab())
    ids = tok.apply_chat_template([{"role": "user", "content": USER}], add_generation_prompt=True, tokenize=True,
                                  return_dict=True)["input_ids"]

    def run(proposers):
        pieces: list[str] = []
        r = sf.submit(list(ids), max_new_tokens=40, chat=False, constraint=p.constraint, proposers=proposers,
                      on_text=pieces.append).result()
        return r, pieces

    plain, _ = run(["none"])
    spec, pieces = run(["ngram"])
    assert spec.token_ids == plain.token_ids and spec.token_ids[:len(script) - 1] == script[1:]
    crossing = [piece for piece in pieces if "</think>" in piece and piece.split("</think>")[1].startswith("{")]
    assert crossing, pieces  # the end marker and the JSON after it committed in one step
    assert spec.metrics.target_forwards < plain.metrics.target_forwards
    reasoning, answer = p.reasoning.split(spec.text)
    assert reasoning.strip() == WORDS and json.loads(answer)["city"]
