"""LoRA adapters through a real server and the official clients, unchanged, on the
tiny Llama with random-weight `peft` adapters: `model` set to an adapter's route
gives that adapter's output (what the offline engine gives with it, and not the
base's), `/v1/models` lists the adapters with their base, adapters load and unload
at run time (vLLM's endpoints), and bad ones get clear 4xx answers."""

import httpx
import openai
import pytest
from friendli import SyncFriendli

from amity.config import EngineConfig
from amity.engine.async_engine import AsyncEngine
from amity.engine.llm_engine import LLMEngine
from amity.engine.sampling_params import SamplingParams
from tests.lora_helpers import ADAPTER_SPECS, build_adapter
from tests.server.conftest import RunningServer, free_port
from tests.server.test_friendli_sdk import NO_RETRIES

PROMPT = "The quick brown fox"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def adapter_dirs(tiny_llama_path, tmp_path_factory):
    return {route: build_adapter(tiny_llama_path, tmp_path_factory.mktemp(f"lora-{route}"), spec, seed)
            for seed, (route, spec) in enumerate(ADAPTER_SPECS.items())}


def _config(tiny_llama_path, lora_modules, max_loras: int = 2) -> EngineConfig:
    return EngineConfig(model=str(tiny_llama_path), dtype="float32", kv_cache_memory="16MiB", num_threads=1,
                        max_loras=max_loras, lora_modules=lora_modules, compile="false")


@pytest.fixture(scope="module")
def expected(tiny_llama_path, adapter_dirs) -> dict:
    """Greedy text of PROMPT per route, from an offline engine."""
    engine = LLMEngine(_config(tiny_llama_path, [f"{r}={d}" for r, d in adapter_dirs.items()], max_loras=3))
    texts = {}
    for route in (None, *ADAPTER_SPECS):
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, adapter=route)
        texts[route] = engine.generate([PROMPT], params)[0].ordered_choices[0].text
    assert len(set(texts.values())) == len(texts), texts  # every adapter changes the answer
    return texts


@pytest.fixture(scope="module")
def lora_server(tiny_llama_path, adapter_dirs):
    engine = AsyncEngine.from_config(_config(tiny_llama_path, [f"full={adapter_dirs['full']}"]))
    with RunningServer(engine, free_port()) as running:
        yield running


@pytest.fixture(scope="module")
def http(lora_server):
    with httpx.Client(base_url=lora_server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def base_name(http):
    return http.get("/v1/models").json()["data"][0]["id"]


def _complete(http, model, **extra):
    return http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
                                              "model": model, **extra})


def test_openai_sdk_routes_by_model(lora_server, expected, base_name):
    oai = openai.OpenAI(base_url=lora_server.url + "/v1", api_key="ignored", max_retries=0)
    for model, route in ((base_name, None), ("full", "full"), (f"{base_name}:full", "full")):
        res = oai.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
        assert res.choices[0].text == expected[route], model
    chunks = list(oai.completions.create(model="full", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                         stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected["full"]
    with pytest.raises(openai.NotFoundError) as error:
        oai.completions.create(model="no-such-adapter", prompt=PROMPT, max_tokens=1)
    assert f"served: '{base_name}', 'full'" in error.value.response.text


def test_friendli_sdk_routes_by_model(lora_server, expected):
    with SyncFriendli(token="not-checked", retry_config=NO_RETRIES, timeout_ms=60_000) as friendli:
        res = friendli.container.completions.complete(
            request={"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "model": "full"},
            server_url=lora_server.url)
        assert res.choices[0].text == expected["full"]
        tokens = friendli.container.token.tokenize(prompt=PROMPT, model="full", server_url=lora_server.url)
        assert tokens.tokens


def test_models_lists_adapters_with_their_base(http, base_name, adapter_dirs):
    data = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == [base_name, "full"]
    assert data[1]["parent"] == base_name and data[1]["root"] == str(adapter_dirs["full"])


def test_load_and_unload_at_run_time(http, expected, adapter_dirs, base_name):
    assert _complete(http, "mlp").status_code == 404
    load = http.post("/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": str(adapter_dirs["mlp"])})
    assert load.status_code == 200, load.text
    assert _complete(http, "mlp").json()["choices"][0]["text"] == expected["mlp"]
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [base_name, "full", "mlp"]
    # Every slot (--max-loras 2) is taken: a third adapter is refused until one is unloaded.
    third = {"lora_name": "qv", "lora_path": str(adapter_dirs["qv-rslora"])}
    refused = http.post("/v1/load_lora_adapter", json=third)
    assert refused.status_code == 400 and "--max-loras" in refused.text
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "mlp"}).status_code == 200
    assert _complete(http, "mlp").status_code == 404
    assert http.post("/v1/load_lora_adapter", json=third).status_code == 200
    assert _complete(http, "qv").json()["choices"][0]["text"] == expected["qv-rslora"]
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "qv"}).status_code == 200
    # The base and the adapter loaded at start are unchanged by all of this.
    assert _complete(http, "full").json()["choices"][0]["text"] == expected["full"]
    assert _complete(http, None).json()["choices"][0]["text"] == expected[None]


def test_bad_adapter_requests(http, base_name, adapter_dirs, tmp_path):
    cases = [
        ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path / "missing")}, 400, "not a directory"),
        ("/v1/load_lora_adapter", {"lora_name": "full", "lora_path": str(adapter_dirs["full"])}, 400,
         "already loaded"),
        ("/v1/load_lora_adapter", {"lora_name": base_name, "lora_path": str(adapter_dirs["mlp"])}, 400,
         "base model's name"),
        ("/v1/load_lora_adapter", {"lora_name": "x"}, 422, "lora_path"),
        ("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}, 404, "no LoRA adapter 'never-loaded'"),
    ]
    for path, body, status, message in cases:
        res = http.post(path, json=body)
        assert res.status_code == status and message in res.text, (body, res.text)


def test_server_without_lora_refuses_loading(tiny_llama_path, adapter_dirs):
    engine = AsyncEngine.from_config(EngineConfig(model=str(tiny_llama_path), dtype="float32",
                                                  kv_cache_memory="16MiB", num_threads=1,
                                                  compile="false"))
    with RunningServer(engine, free_port()) as running, httpx.Client(base_url=running.url) as http:
        res = http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapter_dirs["full"])})
        assert res.status_code == 400 and "--enable-lora" in res.text
        assert len(http.get("/v1/models").json()["data"]) == 1
