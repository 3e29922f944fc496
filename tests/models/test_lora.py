"""LoRA adapters in the engine (models/lora.py, engine/lora_manager.py), on the tiny
random-weight checkpoints with random-weight adapters built by `peft`:

- logits of every prompt position within float tolerance of `peft`'s model with the
  same adapter, for three adapters (all targets; q/v with rsLoRA; MLP with a
  rank_pattern) on Llama and Qwen2 (q/k/v biases);
- a batch mixing three adapters and the base gives each request exactly (tokens and
  logprobs, bit for bit) what it gives alone, and each adapter changes the output;
- the prefix cache never hands one adapter's KV blocks to another, or to the base;
- bad adapters are refused with a message naming what is wrong.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from amity.config import EngineConfig
from amity.engine.errors import RequestError
from amity.engine.llm_engine import LLMEngine
from amity.engine.lora_manager import AdapterInUse, AdapterNotFound
from amity.engine.request import Request, RequestStatus
from amity.engine.sampling_params import SamplingParams
from amity.models.peft_adapter import AdapterError
from tests.lora_helpers import ADAPTER_SPECS, build_adapter, peft_model

LOGITS_ATOL = 1e-4


@pytest.fixture(scope="module")
def adapters(tiny_model_factory, tmp_path_factory):
    """arch -> {route: adapter directory}."""
    built = {}
    for arch in ("llama", "qwen2"):
        base = tiny_model_factory(arch)
        built[arch] = {route: build_adapter(base, tmp_path_factory.mktemp(f"lora-{arch}-{route}"), spec, seed)
                       for seed, (route, spec) in enumerate(ADAPTER_SPECS.items())}
    return built


def lora_engine(path, adapter_dirs: dict, **overrides) -> LLMEngine:
    config = dict(model=str(path), dtype="float32", kv_cache_memory="16MiB", block_size=8, max_num_seqs=8,
                  num_threads=1, max_loras=4, max_lora_rank=16,
                  lora_modules=[f"{route}={d}" for route, d in adapter_dirs.items()])
    return LLMEngine(EngineConfig(**{**config, **overrides}))


def engine_logits(engine: LLMEngine, token_ids: list[int], route: str | None) -> torch.Tensor:
    """Logits at every position, from one prefill pass through the engine's scheduler,
    paged KV cache and model runner (as tests/models/test_parity.py does)."""
    engine.kv.pool.reset_prefix_cache()
    request = Request(request_id="logits", group_id="logits", choice_index=0,
                      prompt_token_ids=token_ids[:1], params=SamplingParams(temperature=0.0),
                      seed=0, eos_token_ids=frozenset(), max_output_tokens=len(token_ids),
                      min_output_tokens=0, forced_token_ids=token_ids[1:] + [0])
    if route is not None:
        adapter = engine.lora.get(route)
        request.adapter_slot, request.adapter_cache_key = adapter.slot, adapter.cache_key
    engine.scheduler.add(request)
    plan = engine.scheduler.schedule()
    result = engine.runner.execute(plan)
    engine.scheduler.update_after_step(plan)
    engine.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
    return result.logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_match_peft(arch, tiny_model_factory, adapters):
    base = tiny_model_factory(arch)
    engine = lora_engine(base, adapters[arch])
    token_ids = torch.randint(1, engine.vocab_size, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    for seed, (route, spec) in enumerate(ADAPTER_SPECS.items()):
        reference = peft_model(base, spec, seed)
        with torch.no_grad():
            expected = reference(torch.tensor([token_ids])).logits[0]
            with reference.disable_adapter():
                base_logits = reference(torch.tensor([token_ids])).logits[0]
        got = engine_logits(engine, token_ids, route)
        assert (expected - base_logits).abs().max() > 100 * LOGITS_ATOL, f"{route} is a no-op adapter"
        torch.testing.assert_close(got, expected, atol=LOGITS_ATOL, rtol=0, msg=route)
    # The base through the LoRA engine is the base.
    torch.testing.assert_close(engine_logits(engine, token_ids, None), base_logits, atol=LOGITS_ATOL, rtol=0)


def _outputs(engine: LLMEngine, jobs: list[tuple[list[int], str | None]]) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their logprobs of each (prompt, adapter route), submitted together."""
    finals = {}
    for i, (prompt, route) in enumerate(jobs):
        params = SamplingParams(temperature=0.0, max_tokens=12, eos_token=[], logprobs=0, adapter=route)
        engine.add_request(f"job-{i}-{len(finals)}-{engine.num_steps}", prompt, params)
        finals[f"job-{i}-{len(finals)}-{engine.num_steps}"] = None
    got = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)
    results = []
    for request_id in finals:
        outs = got[request_id]
        tokens = [t for o in outs for t in o.outputs[0].new_token_ids]
        logprobs = [lp.logprob for o in outs for lp in (o.outputs[0].new_logprobs or [])]
        results.append((tokens, logprobs))
    return results


def test_mixed_batch_gives_each_request_what_it_gives_alone(tiny_llama_path, adapters):
    engine = lora_engine(tiny_llama_path, adapters["llama"], enable_prefix_caching=False,
                         max_num_batched_tokens=64)
    g = torch.Generator().manual_seed(3)
    routes = [None, *ADAPTER_SPECS]
    jobs = [(torch.randint(1, engine.vocab_size, (n,), generator=g).tolist(), routes[i % 4])
            for i, n in enumerate([5, 17, 9, 30, 2, 11, 23, 8])]
    alone = [_outputs(engine, [job])[0] for job in jobs]
    together = _outputs(engine, jobs)
    assert engine.num_steps > 0
    for job, a, t in zip(jobs, alone, together):
        assert t == a, job[1]  # tokens and logprobs, exactly
    # Each adapter changes what the same prompt gives.
    prompt = jobs[0][0]
    per_route = _outputs(engine, [(prompt, route) for route in routes])
    assert len({tuple(lp) for _, lp in per_route}) == len(routes)


def test_prefix_cache_is_not_shared_between_adapters(tiny_llama_path, adapters):
    dirs = adapters["llama"]
    prompt = torch.randint(1, 300, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    uncached = {route: _outputs(lora_engine(tiny_llama_path, dirs, enable_prefix_caching=False),
                                [(prompt, route)])[0]
                for route in (None, "full", "mlp")}
    engine = lora_engine(tiny_llama_path, dirs)

    def run(route):
        params = SamplingParams(temperature=0.0, max_tokens=12, eos_token=[], logprobs=0, adapter=route)
        [final] = engine.generate([prompt], params)
        choice = final.ordered_choices[0]
        return (choice.token_ids, [lp.logprob for lp in choice.logprobs]), final.num_cached_tokens

    def same(output, expected):  # a cached prefix computes its K/V in another chunking
        assert output[0] == expected[0]
        torch.testing.assert_close(output[1], expected[1], atol=1e-4, rtol=0)

    for route in ("full", None, "mlp"):  # each adapter's first run finds nothing cached
        output, cached = run(route)
        assert cached == 0, route
        same(output, uncached[route])
    for route in ("full", None, "mlp"):  # its second run finds its own blocks
        output, cached = run(route)
        assert cached > 0, route
        same(output, uncached[route])
    # An adapter unloaded and another loaded under its name does not inherit its blocks.
    engine.unload_lora_adapter("full")
    engine.load_lora_adapter("full", str(dirs["mlp"]))
    output, cached = run("full")
    assert cached == 0
    same(output, uncached["mlp"])


def test_load_unload_and_limits(tiny_llama_path, adapters):
    dirs = adapters["llama"]
    engine = lora_engine(tiny_llama_path, {"full": dirs["full"]}, max_loras=2)
    params = SamplingParams(temperature=0.0, max_tokens=4, adapter="mlp")
    with pytest.raises(RequestError, match="no LoRA adapter 'mlp'"):
        engine.add_request("r0", [1, 2, 3], params)
    engine.load_lora_adapter("mlp", str(dirs["mlp"]))
    [final] = engine.generate([[1, 2, 3]], params)
    assert len(final.ordered_choices[0].token_ids) == 4
    with pytest.raises(AdapterError, match="already loaded"):
        engine.load_lora_adapter("mlp", str(dirs["mlp"]))
    with pytest.raises(AdapterError, match="slots .*--max-loras.* are taken"):
        engine.load_lora_adapter("third", str(dirs["qv-rslora"]))
    engine.add_request("in-flight", [1, 2, 3], params)
    with pytest.raises(AdapterInUse, match="1 requests in flight"):
        engine.unload_lora_adapter("mlp")
    while engine.has_unfinished_requests():
        engine.step()
    engine.unload_lora_adapter("mlp")
    with pytest.raises(AdapterNotFound):
        engine.unload_lora_adapter("mlp")
    engine.load_lora_adapter("third", str(dirs["qv-rslora"]))  # the freed slot
    assert sorted(engine.lora_adapters()) == ["full", "third"]


def test_engine_without_lora_refuses_adapters(tiny_llama_path, adapters):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_path), dtype="float32", kv_cache_memory="16MiB",
                                    num_threads=1))
    with pytest.raises(AdapterError, match="--enable-lora"):
        engine.load_lora_adapter("full", str(adapters["llama"]["full"]))
    with pytest.raises(RequestError, match="no LoRA adapter"):
        engine.add_request("r", [1, 2], SamplingParams(adapter="full"))


def _copy_adapter(source, target, config_changes=None, tensors=None):
    target.mkdir()
    config = json.loads((source / "adapter_config.json").read_text())
    (target / "adapter_config.json").write_text(json.dumps({**config, **(config_changes or {})}))
    save_file(tensors if tensors is not None else load_file(str(source / "adapter_model.safetensors")),
              str(target / "adapter_model.safetensors"))
    return target


def test_bad_adapters_are_refused_clearly(tiny_model_factory, tiny_llama_path, adapters, tmp_path):
    engine = lora_engine(tiny_llama_path, {}, enable_lora=True, max_lora_rank=8)
    full = adapters["llama"]["full"]
    weights = load_file(str(full / "adapter_model.safetensors"))
    first = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    cases = {
        "missing": (tmp_path / "nowhere", "is not a directory"),
        "no-config": (tmp_path / "empty", "no adapter_config.json"),
        "no-weights": (tmp_path / "no-weights", "no adapter_model.safetensors"),
        "other-base": (build_adapter(tiny_model_factory("qwen3"), tmp_path / "qwen3", ADAPTER_SPECS["full"], 0),
                       r"the base model needs \[r, \d+\] and \[\d+, r\]: an adapter of another base model"),
        "rank": (adapters["llama"]["mlp"], "rank 16, above --max-lora-rank 8"),
        "embedding": (_copy_adapter(full, tmp_path / "embed", tensors={
            **weights, "base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(8, 10)}),
            "unsupported adapter weight 'base_model.model.model.embed_tokens"),
        "lm-head": (_copy_adapter(full, tmp_path / "head", tensors={
            **weights, "base_model.model.lm_head.lora_A.weight": torch.zeros(8, 64)}), "unsupported adapter weight"),
        "dora": (_copy_adapter(full, tmp_path / "dora", {"use_dora": True}), "DoRA"),
        "modules-to-save": (_copy_adapter(full, tmp_path / "save", {"modules_to_save": ["lm_head"]}),
                            "modules_to_save"),
        "bias": (_copy_adapter(full, tmp_path / "bias", {"bias": "all"}), "trained biases"),
        "half": (_copy_adapter(full, tmp_path / "half", tensors={k: v for k, v in weights.items() if k != first}),
                 "layer 0 q_proj lacks its lora_A"),
        "prefix-tuning": (_copy_adapter(full, tmp_path / "prefix", {"peft_type": "PREFIX_TUNING"}), "only LORA"),
    }
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "adapter_config.json").write_text("{}")
    for route, (path, message) in cases.items():
        with pytest.raises(AdapterError, match=message):
            engine.load_lora_adapter(route, str(path))
    assert engine.lora_adapters() == {}


@pytest.mark.slow
def test_compiled_engine_serves_adapters_as_eager(tiny_llama_path, adapters):
    """Adapter slots are step inputs (a buffer written in place), so the compiled
    graphs serve any mix of adapters, and an adapter loaded after compilation, with
    the same results as eager and no more than compilation.py's two graphs."""
    dirs = adapters["llama"]
    g = torch.Generator().manual_seed(11)
    routes = [None, "full", "qv-rslora", "mlp"]
    jobs = [(torch.randint(1, 300, (n,), generator=g).tolist(), routes[i % 4])
            for i, n in enumerate([1, 9, 17, 30, 3, 12])]
    start = {"full": dirs["full"], "qv-rslora": dirs["qv-rslora"]}
    eager = lora_engine(tiny_llama_path, start, max_num_batched_tokens=24)
    eager.load_lora_adapter("mlp", str(dirs["mlp"]))
    expected = _outputs(eager, jobs)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the counts of earlier tests' graphs
    compiled = lora_engine(tiny_llama_path, start, max_num_batched_tokens=24, compile="true")
    compiled.load_lora_adapter("mlp", str(dirs["mlp"]))  # after the graphs were built
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(_outputs(compiled, jobs), expected):
        assert tokens == want_tokens
        torch.testing.assert_close(logprobs, want_logprobs, atol=1e-4, rtol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
