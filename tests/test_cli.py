"""`amity generate`: the quickest proof for a new user, run as a user would."""

import argparse
import os
import subprocess
import sys

import pytest


def test_generate_prints_a_completion_from_the_default_model():
    # "What is the capital of France?" alone is a near tie for the Q4_1 weights at the
    # first token ("L" -1.94 against "The" -2.14 on a float32 KV cache, -1.963 against
    # -1.960 on a bfloat16 one): the answer flipped with the cache's rounding. Asked
    # this way, every cache and the float32 reference path answer Paris.
    result = subprocess.run(
        [sys.executable, "-m", "amity.cli", "generate", "What is the capital city of France? Answer in one sentence.",
         "--chat",
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


def test_chat_prompt_has_one_bos(tiny_tokenizer_dir):
    """A tokenizer that adds BOS and a template that writes it: `--chat` must not
    encode the templated text with special tokens again (a second BOS)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from amity.cli import prompt_ids
    from amity.models.tokenizer import Tokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    hf.bos_token = "<|endoftext|>"
    hf.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", hf.bos_token_id)])
    hf.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer = Tokenizer(hf, set())
    bos = hf.bos_token_id
    assert prompt_ids(tokenizer, "Hello", chat=False) == [bos, *hf.encode("Hello", add_special_tokens=False)]
    assert prompt_ids(tokenizer, "Hello", chat=True) == [bos, *hf.encode("Hello", add_special_tokens=False)]


@pytest.mark.parametrize(("policy", "spin_count"), [("bounded", "3000"), ("passive", "0"),
                                                   ("active", "30000000000")])
def test_omp_wait_policy_reaches_the_openmp_runtime(policy, spin_count):
    """libgomp reads its wait settings once, as torch loads it: the flag must be set by
    then, whatever the environment said. OMP_DISPLAY_ENV makes the runtime print the spins
    a worker makes before it sleeps; the run itself stops at the missing model, after
    torch is loaded."""
    result = subprocess.run(
        [sys.executable, "-m", "amity.cli", "generate", "hi", "--model", "/nonexistent/model.gguf",
         "--omp-wait-policy", policy],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_DISPLAY_ENV": "VERBOSE", "OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "7"})
    assert result.returncode == 2, result.stderr
    assert f"GOMP_SPINCOUNT = '{spin_count}'" in result.stderr


def _parsers(parser):
    """The parser and every subcommand's, nested actions included."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_command_has_help():
    """`--help` formats each option's text (a bare % in one crashed `serve --help`)."""
    from amity.cli import build_parser

    names = []
    for parser in _parsers(build_parser()):
        assert parser.format_help()
        names.append(parser.prog)
    assert {"amity serve", "amity generate", "amity suite"} <= set(names)
