"""`amity bench compare`: systems loaded in turn (A, B, A, B, ...) for at least three
rounds, medians and paired ratios; a missing peer, an already-running one, and two
real tiny amity servers it starts itself."""

import json
import sys

import pytest

from amity.bench import compare
from tests.bench.conftest import L, M
from tests.bench.test_serve import parse


def _level(c, tok_s, ttft, failures=0):
    stats = {"mean": ttft, "p50": ttft, "p90": ttft, "p99": ttft}
    return {"concurrency": c, "request_rate": None, "output_tok_s": tok_s, "ttft_ms": stats,
            "itl_ms": stats, "e2e_ms": stats, "failures": failures, "num_prompts": 8}


def test_missing_peer_is_skipped_and_running_peer_is_measured_every_round(start_server, tmp_path, capsys):
    paced, url = start_server()
    args = parse(["bench", "compare", "--systems", "vllm", "--vllm-python", "/nonexistent/python",
                  "--peer", f"paced={url}", "--gguf", "unused.gguf", "--concurrency", "2", "--num-prompts", "4",
                  "--input-len", str(L), "--output-len", str(M), "--out", str(tmp_path),
                  "--no-progress"])
    assert args.rounds == 3  # the default
    assert compare.main(args) == 0

    table = (tmp_path / "compare.md").read_text()
    assert "| vllm | – | – | skipped (not installed) |" in table
    # The only system that ran is the reference: its own ratios are 1.
    assert "| paced | 2 | 3 |" in table and "| 1.00x |" in table.split("| paced | 2 | 3 |")[1]
    rows = [json.loads(x) for x in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert rows[0] == {"system": "vllm", "status": "skipped (not installed)"}
    assert [(r["system"], r["round"], r["completed"], r["failures"]) for r in rows[1:4]] == [
        ("paced", n, 4, 0) for n in (1, 2, 3)]
    found = rows[4]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == found  # the JSON line printed
    assert found["reference"] == "paced" and found["rounds"] == 3
    assert found["systems"]["vllm"] == {"status": "skipped (not installed)"}
    [level] = found["systems"]["paced"]["levels"]
    assert level["output_tok_s_by_round"] == [r["output_tok_s"] for r in rows[1:4]]
    assert level["output_tok_s"] == sorted(level["output_tok_s_by_round"])[1]
    assert len(paced.bodies) == 3 * 5  # a warm-up and the four, each round
    # Fresh prompts every round: none is one that an earlier round sent (a prefix cache's hit).
    prompts = [[json.dumps(b.get("tokens") or b.get("prompt")) for b in paced.bodies[5 * n + 1:5 * n + 5]]
               for n in range(3)]
    assert all(len(set(p)) == 4 for p in prompts)
    assert not set(prompts[0]) & set(prompts[1]) and not set(prompts[1]) & set(prompts[2])
    assert all((tmp_path / "paced" / f"round-{n}" / "summary.jsonl").exists() for n in (1, 2, 3))


def test_medians_and_paired_ratios():
    rounds = {"a": [[_level(1, 100.0, 50.0)], [_level(1, 90.0, 40.0)], [_level(1, 120.0, 60.0, failures=1)]],
              "b": [[_level(1, 50.0, 100.0)], [_level(1, 60.0, 40.0)], [_level(1, 40.0, 30.0)]],
              "c": "failed to start: boom"}
    found = compare.report(rounds, [], "a")
    [a], [b] = found["systems"]["a"]["levels"], found["systems"]["b"]["levels"]
    assert (a["output_tok_s"], a["ttft_p50_ms"], a["failures"], a["num_prompts"]) == (100.0, 50.0, 1, 24)
    assert (a["tok_s_ratio"], a["ttft_ratio"]) == (1.0, 1.0)
    # Per round a ÷ b: 2.0, 1.5, 3.0 -> 2.0; b's TTFT ÷ a's: 2.0, 1.0, 0.5 -> 1.0.
    assert (b["output_tok_s"], b["tok_s_ratio"], b["ttft_ratio"]) == (50.0, 2.0, 1.0)
    assert found["systems"]["c"] == {"status": "failed to start: boom"}
    table = compare.compare_table(found)
    assert "| b | 1 | 3 | 50.0 | 2.00x | 40 | 1.00x |" in table
    assert "| c | – | – | failed to start: boom |" in table


def test_fewer_than_three_rounds_are_refused(tmp_path):
    args = parse(["bench", "compare", "--systems", "", "--rounds", "2", "--out", str(tmp_path)])
    assert compare.main(args) == 2


@pytest.mark.slow
def test_two_real_servers_take_turns(tiny_llama_path, tmp_path, capsys):
    serve = f"{sys.executable} -m amity.cli serve --model {tiny_llama_path} --port {{port}} --num-threads 1 --compile false"
    args = parse(["bench", "compare", "--systems", "", "--command", f"float32={serve} --dtype float32",
                  "--command", f"auto={serve}", "--concurrency", "1,2", "--num-prompts", "2",
                  "--input-len", "8", "--output-len", "4", "--out", str(tmp_path), "--no-progress"])
    assert compare.main(args) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(run["round"], run["system"]) for run in found["order"]] == [
        (1, "float32"), (1, "auto"), (2, "float32"), (2, "auto"), (3, "float32"), (3, "auto")]
    # In turn: each run ends before the next begins.
    for earlier, later in zip(found["order"], found["order"][1:]):
        assert earlier["ended_unix_s"] <= later["started_unix_s"]
    assert found["reference"] == "float32" and found["rounds"] == 3  # no amity here: the first system
    for name in ("float32", "auto"):
        levels = found["systems"][name]["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 2]
        for lv in levels:
            assert lv["rounds"] == 3 and len(lv["output_tok_s_by_round"]) == 3 and lv["failures"] == 0
            assert lv["output_tok_s"] > 0 and lv["ttft_p50_ms"] > 0 and lv["tok_s_ratio"] > 0
    assert all(lv["tok_s_ratio"] == 1.0 for lv in found["systems"]["float32"]["levels"])
    for name in ("float32", "auto"):  # each server's log: it was started, once
        assert (tmp_path / f"{name}.log").exists()
