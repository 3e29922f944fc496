"""Parity with `transformers`, float32, for every architecture we support.

Tiny random-weight checkpoints (hidden 64, 2 layers, see tests/conftest.py) are
built with `transformers` and saved with `save_pretrained`; our loader reads them
back. For each:

 (a) logits: every position of a prompt, computed in one prefill pass through the
     engine's own path (scheduler -> paged KV cache -> model runner), against
     `transformers`' forward: max |difference| <= LOGITS_ATOL (1e-4, on logits of
     magnitude ~1-10). The decode path's reported logprobs (chosen and top 5)
     against `transformers`' log_softmax of its own `generate` logits, same
     tolerance.
 (b) greedy tokens: 64 steps of our engine identical to `transformers`' greedy
     `generate` (EOS disabled on both sides so neither stops early).

The default model (SmolLM2-135M-Instruct Q4_1 GGUF) is checked the same way
against `transformers`' own GGUF loading.
"""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from amity.engine.request import Request, RequestStatus
from amity.engine.sampling_params import SamplingParams
from amity.models.loader import default_model_path, load_model
from amity.models.registry import MODEL_REGISTRY

LOGITS_ATOL = 1e-4
LOGPROB_ATOL = 1e-4
NUM_STEPS = 64
ARCHS = ["llama", "llama3", "smollm2", "mistral", "qwen2", "qwen3"]
HF_CLASS = {"llama": "LlamaForCausalLM", "llama3": "LlamaForCausalLM", "smollm2": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def engine_logits(engine: LLMEngine, token_ids: list[int]) -> torch.Tensor:
    """Full-vocab float32 logits at every position of `token_ids`, from one prefill
    pass through the engine's scheduler, paged KV cache and model runner.

    Forcing all but the first token makes every position a logits row. The prefix
    cache is emptied first, so that every position is computed here."""
    engine.kv.pool.reset_prefix_cache()
    request = Request(request_id="logits", group_id="logits", choice_index=0,
                      prompt_token_ids=token_ids[:1], params=SamplingParams(temperature=0.0),
                      seed=0, eos_token_ids=frozenset(), max_output_tokens=len(token_ids),
                      min_output_tokens=0, forced_token_ids=token_ids[1:] + [0])
    engine.scheduler.add(request)
    plan = engine.scheduler.schedule()
    assert [s.request for s in plan.scheduled] == [request]
    assert plan.scheduled[0].num_new_tokens == len(token_ids)
    result = engine.runner.execute(plan)
    engine.scheduler.update_after_step(plan)
    engine.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
    assert [p for _, p in result.logit_rows] == list(range(len(token_ids)))
    return result.logits


def hf_greedy(hf, prompt: list[int], steps: int):
    """transformers' own greedy generation (its KV cache), with EOS disabled."""
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                      output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                      pad_token_id=0, temperature=None, top_p=None, top_k=None)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = torch.stack([lg[0] for lg in out.logits]).float().log_softmax(-1)
    return tokens, logprobs


@pytest.fixture(scope="module", params=ARCHS)
def arch_pair(request, tiny_model_factory):
    path = tiny_model_factory(request.param)
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", kv_cache_memory="16MiB",
                                    block_size=16, max_num_seqs=4, num_threads=1))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    hf.eval()
    return request.param, path, engine, hf


def test_checkpoint_is_what_we_think(arch_pair):
    arch, path, engine, hf = arch_pair
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [HF_CLASS[arch]]
    weights = load_file(str(path / "model.safetensors"))
    if arch == "qwen2":
        for name in ("q_proj", "k_proj", "v_proj"):
            bias = weights[f"model.layers.0.self_attn.{name}.bias"]
            assert bias.abs().min() > 0, "qwen2 bias must be random, or the test proves nothing"
    if arch == "qwen3":
        assert config["head_dim"] * config["num_attention_heads"] != config["hidden_size"]
        assert "model.layers.0.self_attn.q_norm.weight" in weights
    if arch == "smollm2":
        assert config["tie_word_embeddings"] and "lm_head.weight" not in weights
    else:
        assert not config["tie_word_embeddings"] and "lm_head.weight" in weights
    if arch == "llama3":
        assert config["rope_parameters"]["rope_type"] == "llama3"
    assert type(engine.model).__name__ == MODEL_REGISTRY[HF_CLASS[arch]].__name__


def test_prefill_logits_match_transformers(arch_pair):
    arch, path, engine, hf = arch_pair
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, engine.vocab_size, (150,), generator=gen).tolist()
    ours = engine_logits(engine, ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert ref.abs().max() > 1.0  # not a degenerate model
    diff = (ours - ref).abs().max().item()
    assert diff <= LOGITS_ATOL, f"{arch}: max |logits diff| {diff:.2e} > {LOGITS_ATOL}"
    assert engine.stats()["num_free_blocks"] == engine.stats()["num_total_blocks"]


def test_llama3_rope_scaling_matters(tiny_model_factory):
    """Otherwise the llama3 case would pass with the scaling ignored: with these
    positions (150 > original_max_position_embeddings 64) it changes the logits."""
    path = tiny_model_factory("llama3")
    scaled = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    config = transformers.AutoConfig.from_pretrained(str(path))
    config.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(path), config=config,
                                                              dtype=torch.float32)
    ids = torch.randint(1, config.vocab_size, (1, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (plain(ids).logits - scaled(ids).logits).abs().max().item()
    assert diff > 100 * LOGITS_ATOL


def test_greedy_tokens_and_logprobs_match_transformers(arch_pair):
    arch, path, engine, hf = arch_pair
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, engine.vocab_size, (23,), generator=gen).tolist()
    ref_tokens, ref_logprobs = hf_greedy(hf, prompt, NUM_STEPS)
    assert len(set(ref_tokens)) > 4, "greedy output is (nearly) constant: raise initializer_range"
    (out,) = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=NUM_STEPS,
                                                      logprobs=5, eos_token=[]))
    choice = out.ordered_choices[0]
    assert choice.token_ids == ref_tokens
    assert len(choice.token_ids) == NUM_STEPS and choice.finish_reason == "length"
    chosen = torch.tensor([lp.logprob for lp in choice.logprobs])
    expected = ref_logprobs.gather(1, torch.tensor(ref_tokens)[:, None])[:, 0]
    torch.testing.assert_close(chosen, expected, atol=LOGPROB_ATOL, rtol=0)
    for lp, row in zip(choice.logprobs, ref_logprobs):
        top = row.topk(5)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in lp.top]), top.values,
                                   atol=LOGPROB_ATOL, rtol=0)


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64,
                                     architectures=["GPT2LMHeadModel"])
    config.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError) as err:
        load_model(tmp_path, torch.float32, torch.device("cpu"))
    message = str(err.value)
    assert "GPT2LMHeadModel" in message
    for name in MODEL_REGISTRY:
        assert name in message


# -- the default model ---------------------------------------------------------

def test_default_model_matches_transformers_gguf():
    """SmolLM2-135M-Instruct Q4_1 through our GGUF loader vs transformers' GGUF loader.

    Tolerances: logits 1e-3 (a 576-wide, 30-layer model, logits of magnitude ~20),
    logprobs 1e-4 on the generated tokens."""
    path = default_model_path()
    engine = LLMEngine(EngineConfig(dtype="float32", kv_cache_memory="64MiB", max_num_seqs=4,
                                    num_threads=1))
    prompt = engine.tokenizer.encode("The capital of France is")
    (out,) = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=NUM_STEPS,
                                                      logprobs=0, eos_token=[]))
    tokens = out.ordered_choices[0].token_ids
    assert len(tokens) == NUM_STEPS
    ours_prefill = engine_logits(engine, prompt + tokens)
    del engine

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + tokens])).logits[0].float()
    diff = (ours_prefill - ref).abs().max().item()
    assert diff <= 1e-3, f"max |logits diff| {diff:.2e}"
    # Greedy: with the same prefix, transformers' argmax is our token at every one of
    # the 64 steps, so its greedy generation is token for token ours.
    ref_next = ref[len(prompt) - 1:-1]
    assert ref_next.argmax(-1).tolist() == tokens
    chosen = torch.tensor([lp.logprob for lp in out.ordered_choices[0].logprobs])
    expected = ref_next.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    torch.testing.assert_close(chosen, expected, atol=LOGPROB_ATOL, rtol=0)
