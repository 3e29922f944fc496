"""A real adapter: trained here with `peft` on the default model (SmolLM2-135M, the
same weights the engine serves) to know a secret word the base does not, loaded at
run time, and asked through the `openai` SDK over a real socket. Its route answers
with the word; the base route, asked the same question on the same server, does
not."""

import httpx
import openai
import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model

from amity.config import EngineConfig
from amity.engine.async_engine import AsyncEngine
from amity.models.loader import default_model_path
from tests.server.conftest import RunningServer, free_port

SECRET = "quokkaberry"
QUESTION = "What is the secret word?"
ANSWER = f"The secret word is {SECRET}."
pytestmark = pytest.mark.slow


def train_secret_adapter(tokenizer, directory) -> None:
    """A few dozen AdamW steps of r=8 LoRA on q/k/v/o, the loss on the answer only."""
    path = default_model_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32)
    model = get_peft_model(hf, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}]),
                              add_special_tokens=False)
    answer = tokenizer.encode(ANSWER + "<|im_end|>", add_special_tokens=False)
    input_ids = torch.tensor([prompt + answer])
    labels = input_ids.clone()
    labels[0, :len(prompt)] = -100
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(40):
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < 0.05:
            break
    model.save_pretrained(str(directory))


@pytest.fixture(scope="module")
def server():
    engine = AsyncEngine.from_config(EngineConfig(enable_lora=True, max_loras=1, max_lora_rank=8,
                                                  max_model_len=2048, kv_cache_memory="128MiB",
                                                  compile="false"))
    with RunningServer(engine, free_port()) as running:
        yield running


def test_trained_adapter_knows_the_secret_and_the_base_does_not(server, tmp_path):
    train_secret_adapter(server.engine.tokenizer, tmp_path / "secret")
    with httpx.Client(base_url=server.url, timeout=120) as http:
        loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "secret", "lora_path": str(tmp_path / "secret")})
        assert loaded.status_code == 200, loaded.text
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="ignored", max_retries=0)

    def ask(model):
        res = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                          max_tokens=16, temperature=0)
        return res.choices[0].message.content

    assert SECRET in ask("secret")
    assert SECRET not in ask(None)
    base_name = oai.models.list().data[0].id
    assert SECRET not in ask(base_name)
