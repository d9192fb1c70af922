"""Output on a stdout that is not UTF-8 (``PYTHONIOENCODING=ascii``, a C locale): ``--json`` stays valid JSON (escapes),
plain text and streams degrade to backslash escapes instead of a UnicodeEncodeError after the whole generation; and
a stdout closed before the first byte (``| head -c 20``) ends the command quietly, with status 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.fakes import PROMPT, WORDS, build_model, build_tokenizer, hf_greedy

# the tiny model's vocabulary with every word accented or in another script: any answer is non-ASCII
ACCENTED = ["<pad>"] + [("é" if i % 2 else "日") + w for i, w in enumerate(WORDS[1:], 1)]


@pytest.fixture(scope="module")
def accented_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("accented")
    model = build_model("llama")
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(ACCENTED)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>").save_pretrained(path)
    return path, model


def run(args: list[str], encoding: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "SPECFRAME_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "specframe.cli", *args], capture_output=True, env=env, timeout=300)


def _args(path, *extra: str) -> list[str]:
    prompt = " ".join(ACCENTED[t] for t in PROMPT)
    return ["generate", prompt, "--model", str(path), "--dtype", "float32", "--threads", "1", "--no-chat",
            "--max-new-tokens", "8", *extra]


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_json_on_a_stdout_that_is_not_utf8_is_valid_json(accented_model, tmp_path, encoding):
    path, model = accented_model
    res = run(_args(path, "--json"), encoding, tmp_path)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    (record,) = [json.loads(line) for line in res.stdout.decode("ascii").splitlines()]  # pure ASCII, valid JSON
    assert record["token_ids"] == hf_greedy(model, PROMPT, 8)
    assert record["text"] == " ".join(ACCENTED[t] for t in record["token_ids"])  # the escapes decode to the text
    assert any(ord(c) > 127 for c in record["text"])


@pytest.mark.parametrize("stream", [False, True])
def test_plain_text_on_an_ascii_stdout_degrades_to_escapes(accented_model, tmp_path, stream):
    path, model = accented_model
    res = run(_args(path, *(["--stream"] if stream else [])), "ascii", tmp_path)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    out = res.stdout.decode("ascii")
    text = " ".join(ACCENTED[t] for t in hf_greedy(model, PROMPT, 8))
    assert out == text.encode("ascii", "backslashreplace").decode("ascii") + "\n"
    assert "Traceback" not in res.stderr.decode(errors="replace")


def test_json_on_a_utf8_stdout_keeps_the_characters(accented_model, tmp_path):
    path, _ = accented_model
    res = run(_args(path, "--json"), "utf-8", tmp_path)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    line = res.stdout.decode("utf-8")
    assert "é" in line or "日" in line
    json.loads(line)


# --- from issue 39's fourth round of reports (each failed on the code before its fix) ---------------------------------


@pytest.mark.parametrize("mode", [["--stream"], ["--json"], []])
def test_generate_into_a_closed_pipe_exits_0(mode, tmp_path):
    """``specframe generate ... | head -c 20``: the reader leaves early; the command ends quietly with status 0."""
    model_dir = tmp_path / "tiny"
    build_model("llama").save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)
    env = {**os.environ, "SPECFRAME_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "specframe", "generate", "ba bb bc", "--model", str(model_dir),
                             "--max-new-tokens", "64", "--no-chat", "--threads", "1", *mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
