"""Pooling requests in the engine: the same scheduler, budget and steps as generation.

References: for an encoder or a decoder classifier, the model's own whole-batch
forward (`PoolingModel`, itself checked against transformers and sentence-transformers
in tests/models); for a causal LM's embeddings, its last token's final hidden state
from a whole-prompt forward. Batching, chunked prefill, prefix-cache hits and mixing
with generation must not change a request's output (bitwise on the engine's CPU
layers, which are batch invariant; a decoder's prefix-cache hit computes the prompt's
end against cached K/V, which moves the last bits, as do other chunk boundaries of a
prompt longer than the step budget: within HIT_ATOL).
"""

import random

import pytest
import torch

from amity.config import EngineConfig
from amity.engine.errors import RequestError
from amity.engine.llm_engine import LLMEngine
from amity.engine.outputs import PoolingOutput
from amity.engine.pooler import Pooler
from amity.engine.pooling_params import PoolingParams
from amity.engine.sampling_params import SamplingParams
from amity.models.packed_batch import pack
from amity.models.pooling import Pooling
from amity.models.pooling_loader import load_pooling_model
from amity.models.quantization import quantize_model

HIT_ATOL = 1e-5
EMBED, CLASSIFY = PoolingParams("embed"), PoolingParams("classify")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, eos_token=[])


def engine_for(path, **overrides) -> LLMEngine:
    config = dict(model=str(path), dtype="float32", kv_cache_memory="16MiB", block_size=8,
                  max_num_seqs=16, max_num_batched_tokens=512, num_threads=1)
    return LLMEngine(EngineConfig(**{**config, **overrides}))


def random_prompts(n: int, vocab: int, lengths=(5, 17, 40, 3, 26), seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def pool_alone(engine: LLMEngine, prompts, params) -> list[torch.Tensor]:
    return [engine.pool([p], params)[0].data for p in prompts]


@pytest.mark.parametrize("arch", ["bert", "distilbert", "qwen2"])
def test_classifier_through_the_engine_matches_the_model_in_any_batch(arch, pooling_checkpoint):
    path = pooling_checkpoint(arch, head=True)
    engine = engine_for(path, enable_prefix_caching=False)  # hits: see the prefix-cache test
    assert engine.task == "classify" and engine.served.is_encoder == (arch != "qwen2")
    prompts = random_prompts(7, engine.vocab_size)
    batched = torch.stack([o.data for o in engine.pool(prompts, CLASSIFY)])
    alone = torch.stack(pool_alone(engine, prompts, CLASSIFY))
    assert torch.equal(batched, alone)  # batch invariance, bitwise
    loaded = load_pooling_model(path, torch.float32, torch.device("cpu"))
    reference = quantize_model(loaded.model, "none", torch.device("cpu"))(pack(prompts))
    torch.testing.assert_close(batched, reference, atol=1e-5, rtol=0)
    assert (batched - batched[0]).abs().max() > 1e-3  # the outputs differ by input


def test_an_encoder_takes_whole_sequences_and_no_blocks(pooling_checkpoint):
    engine = engine_for(pooling_checkpoint("bert", head=False), max_num_batched_tokens=64)
    prompts = random_prompts(6, engine.vocab_size, lengths=(30, 30, 30, 100, 30, 30))
    for i, p in enumerate(prompts):
        engine.add_pooling(f"r{i}", engine.validate_pooling(p, EMBED))
    finished_per_step, outputs = [], {}
    while engine.has_unfinished_requests():
        step = engine.step()
        finished_per_step.append([out.request_id for out in step])
        outputs.update((out.request_id, out.data) for out in step)
    # Each request is done in the step that takes it; two of 30 tokens fit the 64-token
    # budget, a third does not; the one longer than the whole budget runs alone.
    assert finished_per_step == [["r0", "r1"], ["r2"], ["r3"], ["r4", "r5"]]
    assert engine.num_blocks == 0 and not engine.scheduler.running
    alone = pool_alone(engine, prompts, EMBED)
    assert all(torch.equal(outputs[f"r{i}"], a) for i, a in enumerate(alone))


@pytest.fixture(scope="module")
def causal_lm(tiny_llama_path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama_path), dtype=torch.float32)


def hf_hidden(causal_lm, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return causal_lm.model(torch.tensor([prompt])).last_hidden_state[0]


def test_pooling_and_generation_share_steps_and_each_gets_what_it_gets_alone(tiny_llama_path, causal_lm):
    """A causal LM embeds its last token (normalised); pooling requests enter the
    same steps as generation under a small budget (chunked prefill), and neither
    kind changes the other: generated tokens are exactly those of the request run
    alone, vectors the same to HIT_ATOL."""
    engine = engine_for(tiny_llama_path, max_num_batched_tokens=32, enable_prefix_caching=False)
    vocab = engine.vocab_size
    generate_prompts = random_prompts(4, vocab, lengths=(9, 30, 4, 21), seed=1)
    pool_prompts = random_prompts(6, vocab, lengths=(5, 50, 12, 3, 70, 8), seed=2)
    alone_tokens = [engine.generate([p], GREEDY)[0].ordered_choices[0].token_ids for p in generate_prompts]
    alone_vectors = pool_alone(engine, pool_prompts, EMBED)

    for i, p in enumerate(generate_prompts):
        engine.add_request(f"g{i}", p, GREEDY)
    for i, p in enumerate(pool_prompts):
        engine.add_pooling(f"p{i}", engine.validate_pooling(p, EMBED))
    tokens: dict[str, list[int]] = {f"g{i}": [] for i in range(len(generate_prompts))}
    vectors, mixed_steps = {}, 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        kinds = {isinstance(out, PoolingOutput) for out in outputs}
        mixed_steps += kinds == {True, False}
        for out in outputs:
            if isinstance(out, PoolingOutput):
                vectors[out.request_id] = out.data
            else:
                tokens[out.request_id] += out.outputs[0].new_token_ids
    assert mixed_steps >= 2  # vectors came out of steps that also sampled tokens
    assert [tokens[f"g{i}"] for i in range(len(generate_prompts))] == alone_tokens
    # Chunk boundaries here are not those of the prompt alone (decodes share the
    # budget), and a later chunk attends to K/V from the cache: the last bits move.
    for i, vector in enumerate(alone_vectors):
        torch.testing.assert_close(vectors[f"p{i}"], vector, atol=HIT_ATOL, rtol=0)
    # The reference: transformers' last hidden state (final norm included) of the last token.
    for prompt, vector in zip(pool_prompts, alone_vectors):
        expected = torch.nn.functional.normalize(hf_hidden(causal_lm, prompt)[-1], dim=-1)
        torch.testing.assert_close(vector, expected, atol=1e-5, rtol=0)
    assert engine.kv.pool.num_free_blocks == engine.num_blocks  # every block came back


def test_a_pooling_request_reads_the_prefix_cache_and_frees_its_blocks(tiny_llama_path):
    engine = engine_for(tiny_llama_path)
    prompt = random_prompts(1, engine.vocab_size, lengths=(45,), seed=3)[0]
    first = engine.pool([prompt], EMBED)[0]
    second = engine.pool([prompt], EMBED)[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 40  # 5 full blocks of 8
    torch.testing.assert_close(second.data, first.data, atol=HIT_ATOL, rtol=0)
    assert engine.kv.pool.num_free_blocks == engine.num_blocks
    # A generation request shares the prefix the pooling request published.
    engine.add_request("g", prompt + [7], GREEDY)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[0].num_cached_tokens == 40


def test_mean_pooling_over_a_chunked_prompt(tiny_llama_path, causal_lm):
    """Mean pooling reads every prompt position, so it never takes the prefix cache and
    gathers its rows over the chunks of a prompt longer than the step budget."""
    engine = engine_for(tiny_llama_path, max_num_batched_tokens=16)
    engine.pooler = Pooler(Pooling("mean", normalize=False))
    prompts = random_prompts(3, engine.vocab_size, lengths=(50, 7, 33), seed=4)
    engine.pool(prompts, EMBED)  # publishes their blocks
    outputs = engine.pool(prompts, EMBED)
    assert [o.num_cached_tokens for o in outputs] == [0, 0, 0]
    for prompt, out in zip(prompts, outputs):
        torch.testing.assert_close(out.data, hf_hidden(causal_lm, prompt).mean(0), atol=1e-5, rtol=0)


def test_bad_pooling_inputs_are_request_errors(pooling_checkpoint, tiny_llama_path):
    encoder = engine_for(pooling_checkpoint("bert", head=False))
    with pytest.raises(RequestError, match="cannot classify: it is a embed model|cannot classify"):
        encoder.validate_pooling([2, 5, 3], CLASSIFY)
    with pytest.raises(RequestError, match="at most 128") as error:
        encoder.validate_pooling([5] * 129, EMBED)
    assert error.value.field == "input"
    assert encoder.validate_pooling([5] * 128, EMBED)
    with pytest.raises(RequestError, match="no tokens"):
        encoder.validate_pooling([], EMBED)
    with pytest.raises(RequestError, match="outside the vocabulary"):
        encoder.validate_pooling([10**6], EMBED)
    decoder = engine_for(tiny_llama_path, kv_cache_memory="64KiB")
    with pytest.raises(RequestError, match="KV cache holds"):
        decoder.validate_pooling([5] * (decoder.num_blocks * 8 + 1), EMBED)


def test_the_task_is_detected_and_overridden(pooling_checkpoint, tiny_llama_path, minilm_dir):
    from amity.cli import build_parser
    from amity.config import from_namespace

    args = build_parser().parse_args(["serve", "--model", str(minilm_dir), "--task", "embed"])
    assert from_namespace(EngineConfig, args).task == "embed"
    assert engine_for(tiny_llama_path).task == "generate"
    assert engine_for(pooling_checkpoint("qwen2")).task == "classify"
    # A causal LM told to embed pools its last token; a classifier told to embed, its body.
    decoder = engine_for(tiny_llama_path, task="embed")
    assert decoder.task == "embed" and decoder.served.can_generate
    body = engine_for(pooling_checkpoint("bert"), task="embed")
    assert body.task == "embed" and body.pooler.labels is None
    with pytest.raises(ValueError, match="no classification head"):
        engine_for(tiny_llama_path, task="classify")
    with pytest.raises(ValueError, match="cannot generate"):
        engine_for(pooling_checkpoint("bert", head=False), task="generate")


def test_cls_pooling_over_chunks_and_no_generation_on_a_classifier(pooling_checkpoint, tiny_llama_path):
    """CLS pooling reads position 0 in a prompt's first chunk and finishes in its last,
    which gathers nothing; a classifier refuses generation requests."""
    engine = engine_for(tiny_llama_path, max_num_batched_tokens=16, enable_prefix_caching=False)
    engine.pooler = Pooler(Pooling("cls", normalize=False))
    prompt = random_prompts(1, engine.vocab_size, lengths=(40,), seed=5)[0]
    chunked = engine.pool([prompt], EMBED)[0].data
    whole = engine_for(tiny_llama_path, enable_prefix_caching=False)
    whole.pooler = engine.pooler
    torch.testing.assert_close(chunked, whole.pool([prompt], EMBED)[0].data, atol=HIT_ATOL, rtol=0)
    classifier = engine_for(pooling_checkpoint("qwen2"))
    with pytest.raises(RequestError, match="cannot generate text: it is a classify model"):
        classifier.validate([1, 2, 3], GREEDY)
