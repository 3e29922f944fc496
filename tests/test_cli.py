"""`amity generate`: the quickest proof for a new user, run as a user would."""

import subprocess
import sys


def test_generate_prints_a_completion_from_the_default_model():
    result = subprocess.run(
        [sys.executable, "-m", "amity.cli", "generate", "What is the capital of France?", "--chat",
         "--max-tokens", "12", "--kv-cache-memory", "64MiB"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_unknown_model_path_is_a_clear_error():
    result = subprocess.run(
        [sys.executable, "-m", "amity.cli", "generate", "hi", "--model", "/nonexistent/model.gguf"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "/nonexistent/model.gguf" in result.stderr
    assert "Traceback" not in result.stderr
