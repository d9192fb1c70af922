"""Block drafters through ``specframe serve`` (issue 66, 5): the official openai client against a live server over a
tiny model, a random DFlash2 drafter and a random PARD draft (both in their published layouts): chat completions,
streamed and not, at temperature 0 are the text of plain decoding, and the usage's speculation block names the block
drafter that drafted; served in one batch beside plain requests."""

from __future__ import annotations

import concurrent.futures

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

import specframe  # noqa: E402
from specframe.learned import dflash as df  # noqa: E402

from tests.fakes import build_model, build_tokenizer, chat_target, live_server  # noqa: E402

WORDS = ["ba bb bc ba bb bd", "ca cb cc cd ca cb", "da db dc da db dc dd", "fa fb fc fa fb fc fa"]


@pytest.fixture(scope="module")
def sf():
    sf = specframe.load(target=chat_target(initializer_range=0.2), batch_size=4, max_new_tokens=24)
    yield sf
    sf.close()


@pytest.fixture(scope="module")
def block_proposers(sf, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-block")
    d = df.DFlashDrafter.new(sf.target.model.config, df.DFLASH2, num_layers=1, block_size=6, mask_token_id=3, seed=2)
    df.save_dflash(d, root / "dflash")
    draft = build_model("llama", seed=1)
    draft.config.pard_token, draft.config.spd_type = 63, "pard"  # AMD's fields: a PARD draft, mask token 63
    draft.save_pretrained(root / "pard")
    build_tokenizer().save_pretrained(root / "pard")
    return {"dflash": [{"name": "dflash", "checkpoint": str(root / "dflash")}],
            "pard+ngram": [{"name": "ngram"}, {"name": "draft-model", "model": str(root / "pard"), "k": 4}]}


@pytest.fixture(scope="module")
def client(sf):
    from specframe.serve.app import create_app

    app = create_app(sf, model_name="tiny", allowed={"none", "ngram", "dflash", "draft-model"}, max_tokens_limit=64)
    with live_server(app) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def _chat(client, text, proposers, stream=False):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}], max_tokens=20,
                                          temperature=0, stream=stream,
                                          extra_body={"speculative": {"proposers": proposers}})


@pytest.mark.parametrize("strategy", ["dflash", "pard+ngram"])
def test_a_block_drafter_serves_the_text_of_plain_decoding_streamed_or_not(client, block_proposers, strategy):
    props = block_proposers[strategy]
    block = props[-1]["name"]
    drafted = 0
    for text in WORDS:
        plain = _chat(client, text, [{"name": "none"}])
        got = _chat(client, text, props)
        assert got.choices[0].message.content == plain.choices[0].message.content
        assert got.usage.completion_tokens == plain.usage.completion_tokens
        spec = got.usage.model_extra["speculation"]
        assert block in spec["proposers"]
        drafted += spec["proposers"][block]["drafted"]
        chunks = list(_chat(client, text, props, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert drafted > 0


def test_block_drafters_batched_beside_plain_requests_change_no_output(client, block_proposers):
    plain = [_chat(client, t, [{"name": "none"}]).choices[0].message.content for t in WORDS]
    jobs = [(t, props) for t in WORDS for props in ([{"name": "none"}], *block_proposers.values())]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda j: _chat(client, *j).choices[0].message.content, jobs))
    assert got == [plain[WORDS.index(t)] for t, _ in jobs]
