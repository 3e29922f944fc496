"""The pure helpers of benchmarks/prefix_cache_ttft.py and benchmarks/memory_flat.py:
how they read /proc and turn measurements into figures (no server is started)."""

import importlib.util
import os
import random
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    if str(BENCHMARKS) not in sys.path:  # as when run as a script: its folder is on the path
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


memory_flat = load("memory_flat")
prefix_cache_ttft = load("prefix_cache_ttft")
MIB = 2**20


def test_parse_vm_kib_reads_the_field_asked_for():
    status = "Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t   700 kB\nVmRSS:\t   512 kB\n"
    assert memory_flat.parse_vm_kib(status, "VmRSS") == 512
    assert memory_flat.parse_vm_kib(status, "VmHWM") == 700
    with pytest.raises(ValueError):
        memory_flat.parse_vm_kib(status, "VmSwap")


def test_rss_bytes_of_this_process_matches_its_proc_status():
    rss = memory_flat.rss_bytes(os.getpid())
    own = memory_flat.parse_vm_kib(Path("/proc/self/status").read_text(), "VmRSS") * 1024
    assert rss > 0 and abs(rss - own) < 64 * MIB


def test_memory_summary_growth_is_relative_to_the_first_sample():
    samples = [{"requests": n, "rss_bytes": b * MIB}
               for n, b in ((0, 1000), (200, 1030), (400, 1010))]
    s = memory_flat.summarize(samples)
    assert (s["rss_after_warmup_mib"], s["rss_end_mib"], s["rss_max_mib"]) == (1000, 1010, 1030)
    assert (s["growth_end_pct"], s["growth_max_pct"], s["growth_end_mib"]) == (1.0, 3.0, 10.0)
    assert s["target_met"]


@pytest.mark.parametrize("worst, met", [(1050, True), (1051, False), (949, False)])
def test_memory_target_is_within_5_percent_either_way(worst, met):
    samples = [{"requests": 0, "rss_bytes": 1000 * MIB}, {"requests": 200, "rss_bytes": worst * MIB},
               {"requests": 400, "rss_bytes": 1000 * MIB}]
    assert memory_flat.summarize(samples)["target_met"] is met


def test_the_request_mix_is_seeded_and_covers_every_kind():
    a = [memory_flat.make_request(random.Random(0), 8) for _ in range(1)]
    b = [memory_flat.make_request(random.Random(0), 8) for _ in range(1)]
    assert a == b
    rng = random.Random(1)
    reqs = [memory_flat.make_request(rng, 8) for _ in range(500)]
    assert {kind for kind, _, _ in reqs} == set(memory_flat.KINDS)
    for kind, path, body in reqs:
        assert path == ("/v1/chat/completions" if "messages" in body else "/v1/completions")
        assert body.get("stream", False) == (kind in ("completion_stream", "chat_stream",
                                                      "stream_dropped"))
        assert body["max_tokens"] == (32 if kind in ("stream_dropped", "abandoned") else 8)


def test_prefix_summary_ratio_and_cache_check():
    cold = [{"ttft_ms": t, "cached_tokens": 0} for t in (1000, 1200, 900)]
    warm = [{"ttft_ms": t, "cached_tokens": 1024} for t in (100, 150, 90)]
    s = prefix_cache_ttft.summarize(cold, warm, 1024)
    assert (s["cold_ttft_ms_median"], s["warm_ttft_ms_median"], s["warm_over_cold"]) == (1000, 100, 0.1)
    assert s["target_met"] and s["cache_hits_as_expected"]
    warm[1]["cached_tokens"] = 512  # one warm request missed part of the prefix
    assert not prefix_cache_ttft.summarize(cold, warm, 1024)["cache_hits_as_expected"]
    warm = [{"ttft_ms": 300, "cached_tokens": 1024}]
    assert not prefix_cache_ttft.summarize(cold, warm, 1024)["target_met"]
