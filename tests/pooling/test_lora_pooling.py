"""LoRA adapters on the pooling routes (issue 18), over a real socket, with random-weight
`peft` adapters. The tiny Llama served with `--task embed`, through the `openai` SDK:
`model` set to the adapter's route (alone or as `BASE:ROUTE`) embeds with the adapter,
as `peft`'s model's last-token final hidden state, L2-normalised; the base route
embeds with the base, also when both kinds share the engine's steps and its prefix
cache. A tiny Llama decoder classifier on `/classify`: the adapter route gives
`peft`'s class probabilities. An encoder refuses LoRA at load."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
import transformers
from peft import PeftModel

from amity.config import EngineConfig
from amity.engine.async_engine import AsyncEngine
from amity.engine.llm_engine import LLMEngine
from tests.lora_helpers import ADAPTER_SPECS, build_adapter
from tests.server.conftest import RunningServer, free_port

# Long enough that its first blocks land in the prefix cache (16-token blocks).
LONG = "Stop strings may span token boundaries, so the detokenizer must hold text back. " * 3
TEXTS = ["The quick brown fox", LONG, "a"]
ATOL = 1e-5  # float32 on both sides: what the engine's vectors match transformers' to


@pytest.fixture(scope="module")
def adapter_dir(tiny_llama_path, tmp_path_factory):
    return build_adapter(tiny_llama_path, tmp_path_factory.mktemp("lora-embed"), ADAPTER_SPECS["full"], seed=0)


@pytest.fixture(scope="module")
def oai(tiny_llama_path, adapter_dir):
    config = EngineConfig(model=str(tiny_llama_path), task="embed", dtype="float32", kv_cache_memory="16MiB",
                          num_threads=1, lora_modules=[f"full={adapter_dir}"])
    with RunningServer(AsyncEngine.from_config(config), free_port()) as running:
        yield openai.OpenAI(base_url=running.url + "/v1", api_key="ignored", max_retries=0)


@pytest.fixture(scope="module")
def expected(tiny_llama_path, adapter_dir) -> dict[str | None, list[torch.Tensor]]:
    """Each text's vector from transformers + peft: None for the base, "full" with the adapter."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_llama_path))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama_path), dtype=torch.float32)
    lora = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    decoder = lora.base_model.model.model  # the Llama body, adapter layers in place

    def vectors() -> list[torch.Tensor]:
        out = []
        for text in TEXTS:
            with torch.no_grad():
                hidden = decoder(torch.tensor([tokenizer.encode(text)])).last_hidden_state[0, -1]
            out.append(torch.nn.functional.normalize(hidden, dim=-1))
        return out

    with_adapter = vectors()
    with lora.disable_adapter():
        without = vectors()
    return {None: without, "full": with_adapter}


def _embed(oai, model) -> list[torch.Tensor]:
    res = oai.embeddings.create(model=model, input=TEXTS)
    return [torch.tensor(d.embedding) for d in res.data]


def test_the_adapter_route_embeds_with_the_adapter(oai, expected):
    base_name = oai.models.list().data[0].id
    for i in range(len(TEXTS)):  # the adapter changes every vector
        assert (expected["full"][i] - expected[None][i]).abs().max() > 1e-2
    # Base first, so the adapter's requests meet the base's blocks in the prefix cache.
    for model, route in ((None, None), (base_name, None), ("full", "full"), (f"{base_name}:full", "full"),
                         (None, None)):
        for got, want in zip(_embed(oai, model), expected[route], strict=True):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=lambda m: f"{model}: {m}")


def test_base_and_adapter_requests_in_flight_together(oai, expected):
    models = [None, "full"] * 4
    with ThreadPoolExecutor(len(models)) as pool:
        results = list(pool.map(lambda model: _embed(oai, model), models))
    for model, vectors in zip(models, results):
        for got, want in zip(vectors, expected[model], strict=True):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_an_unknown_route_is_a_404_naming_the_routes(oai):
    with pytest.raises(openai.NotFoundError) as error:
        oai.embeddings.create(model="no-such-adapter", input="hi")
    assert "'full'" in error.value.response.text


@pytest.fixture(scope="module")
def classifier(pooling_checkpoint, tmp_path_factory):
    """The tiny Llama classifier and an adapter on its body (no `score` in it:
    `modules_to_save` is refused, README's LoRA section)."""
    path = pooling_checkpoint("llama")
    adapter = build_adapter(path, tmp_path_factory.mktemp("lora-classify"), ADAPTER_SPECS["full"], seed=1,
                            auto_class=transformers.AutoModelForSequenceClassification)
    return path, adapter


def test_the_adapter_route_classifies_with_the_adapter(classifier):
    path, adapter_dir = classifier
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    base = transformers.AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32)
    lora = PeftModel.from_pretrained(base, str(adapter_dir)).eval()

    def probs() -> list[torch.Tensor]:
        with torch.no_grad():
            return [lora(torch.tensor([tokenizer.encode(t)])).logits[0].softmax(-1) for t in TEXTS]

    expected = {"full": probs()}
    with lora.disable_adapter():
        expected[None] = probs()
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(expected["full"], expected[None]))

    config = EngineConfig(model=str(path), dtype="float32", kv_cache_memory="16MiB", num_threads=1,
                          lora_modules=[f"full={adapter_dir}"])
    with RunningServer(AsyncEngine.from_config(config), free_port()) as running:
        for model in (None, "full", None):
            res = httpx.post(running.url + "/classify", json={"model": model, "input": TEXTS}, timeout=60)
            assert res.status_code == 200, res.text
            for got, want in zip(res.json()["data"], expected[model], strict=True):
                torch.testing.assert_close(torch.tensor(got["probs"]), want, atol=ATOL, rtol=0)


def test_an_encoder_refuses_lora_at_load(pooling_checkpoint, adapter_dir):
    config = EngineConfig(model=str(pooling_checkpoint("bert")), dtype="float32", num_threads=1,
                          lora_modules=[f"full={adapter_dir}"])
    with pytest.raises(ValueError, match="is an encoder; LoRA adapters serve decoders"):
        LLMEngine(config)
