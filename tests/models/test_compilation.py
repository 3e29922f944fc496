"""`--compile` changes speed, not results, and compiles two graphs only.

A compiled engine and an eager one run the same mixed workload on the tiny
Llama: prompts of 1 to 40 tokens, a small token budget so that prefills are
chunked and share steps with decodes, and requests arriving while others run.
Greedy tokens must be identical and logprobs equal within float tolerance; and
whatever the mix of a step, dynamo must not build more than the two graphs
(one-token steps and the rest) that compilation.py promises. `--compile auto`
(the default) runs the same workload eagerly while a thread compiles, and again
after it switched: the same tokens, and the live KV cache untouched by the compile.
The compiled graphs write the engine's one KV-cache tensor in place, each layer at its
own offset: after the same workload it holds what the eager engine's holds.
The graph's C++ reaches our ops through their C entry points, not the dispatcher.
"""

import sys
import threading

import pytest
import torch
from torch._inductor.utils import run_and_get_cpp_code

from amity.config import EngineConfig
from amity.engine.background_compile import COMPILE_SWITCH_INTERVAL_S, CompileState
from amity.engine.llm_engine import LLMEngine
from amity.engine.outputs import FinalOutput
from amity.engine.sampling_params import SamplingParams
from amity.models.attention import AttentionMetadata
from amity.models.compilation import CompiledForward
from amity.models.cpu_kernels import load_cpu_kernels
from amity.models.graph_call import GraphCalls
from amity.models.loader import load_model
from amity.models.quantization import Bf16Linear, PackedLinear, q4_1_linear

PROMPT_LENS = [1, 3, 9, 17, 40, 2, 25]


def _run(engine: LLMEngine, vocab: int) -> dict[str, tuple[list[int], list[float]]]:
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=10, eos_token=[], logprobs=0)
    finals: dict[str, FinalOutput] = {}
    pending = [(f"r{i}", torch.randint(1, vocab, (n,), generator=g).tolist())
               for i, n in enumerate(PROMPT_LENS)]
    # Two requests up front, then one more every other step.
    for request_id, prompt in pending[:2]:
        engine.add_request(request_id, prompt, params)
    pending = pending[2:]
    step = 0
    while engine.has_unfinished_requests() or pending:
        if pending and step % 2 == 0:
            engine.add_request(*pending.pop(0), params)
        for out in engine.step():
            finals.setdefault(out.request_id, FinalOutput(out.request_id)).add(out)
        step += 1
    assert all(f.finished for f in finals.values())
    return {request_id: (f.ordered_choices[0].token_ids, [lp.logprob for lp in f.ordered_choices[0].logprobs])
            for request_id, f in finals.items()}


def _engine(path, compile: str, quantization: str = "none") -> LLMEngine:
    loaded = load_model(path, torch.float32, torch.device("cpu"))
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", kv_cache_memory="16MiB",
                                  block_size=8, max_num_seqs=8, max_num_batched_tokens=24,
                                  num_threads=1, compile=compile, quantization=quantization),
                     loaded=loaded)


def _count_graphs_from_here() -> None:
    """Dynamo's graph counter from zero, for this test's engines only: an earlier test's
    engine (`--compile auto`, the default) may still be compiling in its thread."""
    for thread in threading.enumerate():
        if thread.name == "amity-compile":
            thread.join(timeout=600)  # a cold compile takes about three minutes here
            assert not thread.is_alive(), "an earlier engine's background compile never ended"
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps them


def _assert_same(got, expected):
    assert set(got) == set(expected) == {f"r{i}" for i in range(len(PROMPT_LENS))}
    for request_id, (tokens, logprobs) in expected.items():
        assert got[request_id][0] == tokens, request_id
        torch.testing.assert_close(got[request_id][1], logprobs, atol=1e-4, rtol=0)


def test_compiled_engine_matches_eager(tiny_llama_path):
    eager = _engine(tiny_llama_path, compile="false")
    expected = _run(eager, eager.vocab_size)
    _count_graphs_from_here()
    compiled = _engine(tiny_llama_path, compile="true")
    _assert_same(_run(compiled, eager.vocab_size), expected)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    # The same schedule fills the same blocks: the compiled graphs wrote every layer's
    # K and V into the engine's one cache tensor, in place and each at its own offset
    # (a copy of the cache, or views at a wrong offset, leave it unlike the eager one's).
    written = eager.kv_cache.flatten(2).abs().sum(-1) > 0  # [layer, K/V]: any slot written
    assert written.all()
    torch.testing.assert_close(compiled.kv_cache, eager.kv_cache, atol=1e-4, rtol=0)


def test_steps_call_the_compiled_graphs_directly(tiny_llama_path, monkeypatch):
    """graph_call.py: once dynamo has compiled a graph, the steps its guards admit call
    it without dynamo, with dynamo's results to the bit; a parameter replaced on its
    module is read anew there, as dynamo's own code reads it."""
    def run_and_replace_norm(engine):
        first = _run(engine, engine.vocab_size)
        norm = engine.model.model.norm
        norm.weight = torch.nn.Parameter(norm.weight.detach() * 1.5)
        return first, _run(engine, engine.vocab_size)

    engine = _engine(tiny_llama_path, compile="true")
    compiled, calls = engine.runner.forward, []
    engine.runner.forward = lambda *args: (calls.append(1), compiled(*args))[1]
    graphs = compiled._graphs
    assert len(graphs._direct) == 2  # warm_up's two graphs, both taken in
    before = graphs.direct_calls
    direct = run_and_replace_norm(engine)
    assert graphs.direct_calls - before == len(calls) > 0  # every step
    monkeypatch.setattr(GraphCalls, "call", lambda self, f_locals: None)  # every step through dynamo
    through_dynamo = run_and_replace_norm(_engine(tiny_llama_path, compile="true"))
    for got, expected in zip(direct, through_dynamo):
        assert got == expected
    assert direct[0] != direct[1]  # the replaced weight took effect


def test_second_compiled_model_keeps_its_own_graphs(tiny_llama_path):
    """Dynamo caches graphs per code object, and compilation.py skips guards on
    modules: a second model of another structure must still get its own graphs."""
    first = _engine(tiny_llama_path, compile="true")
    _run(first, first.vocab_size)
    eager = _engine(tiny_llama_path, compile="false", quantization="int8-weight")
    expected = _run(eager, eager.vocab_size)
    second = _engine(tiny_llama_path, compile="true", quantization="int8-weight")
    _assert_same(_run(second, eager.vocab_size), expected)


def test_background_compile_switches_between_steps_without_changing_results(tiny_llama_path):
    eager = _engine(tiny_llama_path, compile="false")
    expected = _run(eager, eager.vocab_size)
    _count_graphs_from_here()
    engine = _engine(tiny_llama_path, compile="auto")
    assert engine.compile_state is CompileState.EAGER  # until a server starts it
    switch_interval_s = sys.getswitchinterval()
    engine.start_background_compile()
    background = engine._background_compile
    assert engine.compile_state is CompileState.COMPILING
    # Steps wait for the compile thread's GIL at most this long an op (background_compile.py);
    # the compile takes seconds, so it is still under way here.
    assert sys.getswitchinterval() == pytest.approx(COMPILE_SWITCH_INTERVAL_S)
    # Eager steps beside the compile; with inductor's cache warm from the tests above,
    # the compile may end during them and a later step switch: the results stay.
    _assert_same(_run(engine, engine.vocab_size), expected)
    live_kv = engine.kv_cache.clone()
    assert background.wait(timeout_s=600) and not background.failed
    assert engine.compile_state is CompileState.COMPILED
    assert sys.getswitchinterval() == pytest.approx(switch_interval_s)  # given back
    assert torch.equal(live_kv, engine.kv_cache)
    _assert_same(_run(engine, engine.vocab_size), expected)
    assert isinstance(engine.runner.forward, CompiledForward)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2


def test_an_eager_step_never_runs_inside_an_fx_trace_of_the_compile():
    """torch.fx's Tracer.trace patches nn.Module.__call__ for the whole process while
    it traces (AOT autograd and inductor trace while a background compile runs): a
    module called from another thread meanwhile goes through the tracer and fails.
    With the background compile's serialization, the eager side waits for the trace."""
    import threading

    from amity.engine import background_compile

    inside, go = threading.Event(), threading.Event()
    eager = torch.nn.Sequential(torch.nn.Linear(4, 4))
    x = torch.randn(2, 4)

    class Slow(torch.nn.Module):
        def forward(self, y):
            inside.set()
            go.wait(10)
            return y + 1

    def call_eager_during_a_trace(serialized: bool) -> BaseException | torch.Tensor:
        inside.clear(), go.clear()
        tracer = threading.Thread(target=lambda: torch.fx.symbolic_trace(Slow()))
        tracer.start()
        assert inside.wait(10)
        result: list = []

        def step():
            try:
                if serialized:
                    with background_compile.one_at_a_time():
                        result.append(eager(x))
                else:
                    result.append(eager(x))
            except BaseException as error:  # what the engine thread would have raised
                result.append(error)

        stepper = threading.Thread(target=step)
        stepper.start()
        stepper.join(0.3)
        waited = stepper.is_alive()
        go.set()
        tracer.join(10), stepper.join(10)
        assert waited == serialized
        return result[0]

    assert isinstance(call_eager_during_a_trace(serialized=False), NameError)  # the hazard
    background_compile._serialize_fx_traces()
    assert torch.equal(call_eager_during_a_trace(serialized=True), eager(x))


def test_compiled_code_calls_our_ops_directly():
    """Each of our ops that a graph calls (every signature: optional tensors given and
    not, a bool, a float, mutated caches) goes through its C entry point
    (csrc/inductor_shims.cpp, declared in compilation.py), with the eager op's bits."""
    load_cpu_kernels()
    gen = torch.Generator().manual_seed(0)

    def linear(bias: bool) -> torch.nn.Linear:
        layer = torch.nn.Linear(64, 48, bias=bias)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(48, 64, generator=gen) * 0.1)
            if bias:
                layer.bias.copy_(torch.randn(48, generator=gen))
        return layer

    blocks, packed, pairs = q4_1_linear(linear(True)), PackedLinear(linear(False), "int8"), Bf16Linear(linear(True))
    tiles = bool(torch.ops.amity.amx_tiles())  # block_linear refuses tile rows on a CPU without AMX
    tile_rows = torch.tensor([False, tiles, tiles])

    def forward(inputs_embeds, positions, kv_cache, meta):
        x = inputs_embeds * 2
        y = (torch.ops.amity.block_linear(x, blocks.weight_packed, blocks.format, blocks.bias, tile_rows)
             + torch.ops.amity.block_linear(x, blocks.weight_packed, blocks.format, None, None)
             + torch.ops.amity.packed_linear(x, packed.weight_packed, packed.weight_scale, None)
             + torch.ops.amity.bf16_linear(x, pairs.weight_packed, pairs.bias, False))
        q, k, v = (y[:, 16 * i:16 * i + 16].reshape(-1, 1, 16) for i in range(3))
        attended = torch.ops.amity.paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta.slot_mapping,
                                                   meta.query_start, meta.context_lens, meta.block_tables,
                                                   0.25, tile_rows)
        return y, attended + positions[:, None, None]

    ids = torch.arange(3)
    meta = AttentionMetadata(slot_mapping=ids.clone(), query_start=torch.tensor([0, 3]),
                             context_lens=torch.tensor([3]), block_tables=torch.zeros((1, 1), dtype=torch.long))
    x = torch.randn(3, 64, generator=gen)
    expected = forward(x, ids, torch.zeros(2, 1, 4, 1, 16).bfloat16(), meta)
    compiled, kv_cache = CompiledForward(forward, torch.device("cpu")), torch.zeros(2, 1, 4, 1, 16).bfloat16()
    with torch._inductor.config.patch(fx_graph_cache=False):  # a cache hit generates no code to read
        got, code = run_and_get_cpp_code(compiled, x, ids, kv_cache, meta)
    for name in ("block_linear", "packed_linear", "bf16_linear", "paged_attention"):
        assert f"aoti_torch_cpu_{name}(" in code, name
    assert 'aoti_torch_call_dispatcher("amity' not in code
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
