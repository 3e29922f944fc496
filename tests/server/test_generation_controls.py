"""Wire-level generation controls whose text form the server translates: `bad_words`
(tokenized with and without a leading space) and chat `logit_bias`."""

from amity.server.protocol import bad_word_tokens


def complete(http, **body):
    res = http.post("/v1/completions", json={"temperature": 0, "max_tokens": 8, **body})
    assert res.status_code == 200, res.text
    return res.json()["choices"][0]


def test_bad_word_variants_cover_both_spacings(engine):
    tokenizer = engine.tokenizer
    variants = bad_word_tokens(["Paris"], tokenizer)
    assert tokenizer.encode("Paris", add_special_tokens=False) in variants
    assert tokenizer.encode(" Paris", add_special_tokens=False) in variants


def test_bad_words_keep_the_word_out_of_the_output(http):
    prompt = "The capital of France is"
    assert "Paris" in complete(http, prompt=prompt)["text"]  # what the model says unhindered
    banned = complete(http, prompt=prompt, bad_words=["Paris"])
    assert "Paris" not in banned["text"]


def test_chat_logit_bias_forces_a_token(http, engine):
    token = engine.tokenizer.encode(" banana", add_special_tokens=False)[0]
    res = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 3,
        "temperature": 0, "logit_bias": {str(token): 100}})
    assert res.status_code == 200, res.text
    content = res.json()["choices"][0]["message"]["content"]
    assert content.split() == ["banana"] * 3
