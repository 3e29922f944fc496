"""`amity bench compare` on what needs no model: a missing peer and an already-running one."""

import json

from amity.bench import compare
from tests.bench.conftest import L, M
from tests.bench.test_serve import parse


def test_missing_peer_is_skipped_and_running_peer_is_measured(start_server, tmp_path):
    paced, url = start_server()
    args = parse(["bench", "compare", "--systems", "vllm", "--vllm-python", "/nonexistent/python",
                  "--peer", f"paced={url}", "--gguf", "unused.gguf", "--concurrency", "2", "--num-prompts", "4",
                  "--input-len", str(L), "--output-len", str(M), "--out", str(tmp_path),
                  "--no-progress"])
    assert compare.main(args) == 0

    table = (tmp_path / "compare.md").read_text()
    assert "| vllm | – | skipped (not installed) |" in table
    # No amity row in this run, so no ratio can be made up for the peer.
    assert "| paced | 2 |" in table and "| – |" in table.split("| paced | 2 |")[1]
    rows = [json.loads(x) for x in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert rows[0] == {"system": "vllm", "status": "skipped (not installed)"}
    assert (rows[1]["system"], rows[1]["completed"], rows[1]["failures"]) == ("paced", 4, 0)
    assert len(paced.bodies) == 5  # the warm-up and the four
    assert (tmp_path / "paced" / "summary.jsonl").exists()
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_ratios_are_amity_over_peer_per_level():
    def level(c, tok_s, ttft):
        stats = {"mean": ttft, "p50": ttft, "p90": ttft, "p99": ttft}
        return {"concurrency": c, "request_rate": None, "output_tok_s": tok_s, "ttft_ms": stats,
                "itl_ms": stats, "e2e_ms": stats, "failures": 0, "num_prompts": 8}

    table = compare.compare_table({"amity": [level(1, 100.0, 50.0), level(8, 400.0, 80.0)],
                                   "peer": [level(1, 80.0, 100.0), level(8, 200.0, 40.0)]})
    assert "| peer | 1 | 80.0 | 1.25x | 100 | 2.00x |" in table
    assert "| peer | 8 | 200.0 | 2.00x | 40 | 0.50x |" in table
