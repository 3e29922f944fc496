"""The `amity` command line: `amity generate`, `amity serve`, `amity bench`, `amity suite`,
`amity admin`, `amity knowledge`."""

import argparse
import logging
import sys

from amity.bench.cli import add_bench_parser
from amity.config import (EngineConfig, ServerConfig, StoreConfig, SuiteConfig, add_arguments,
                          from_namespace)
from amity.omp_wait_policy import apply_omp_wait_policy
from amity.suite.admin import add_admin_parser
from amity.suite.knowledge.cli import add_knowledge_parser


def prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    """With `chat`, the prompt as the only user turn of the chat template. The template
    writes its own special tokens (BOS, role markers), so its text is encoded without
    adding them again, as the server does (chat_prompt.render)."""
    if not chat:
        return tokenizer.encode(prompt)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    return tokenizer.encode(text, add_special_tokens=False)


def _generate(args: argparse.Namespace) -> None:
    apply_omp_wait_policy(args.omp_wait_policy)
    from amity.engine.llm_engine import LLMEngine
    from amity.engine.sampling_params import SamplingParams

    engine = LLMEngine(from_namespace(EngineConfig, args))
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                            top_p=args.top_p, top_k=args.top_k)
    [final] = engine.generate([prompt_ids(engine.tokenizer, args.prompt, args.chat)], params)
    sys.stdout.write(final.ordered_choices[0].text + "\n")


def _serve(args: argparse.Namespace) -> None:
    apply_omp_wait_policy(args.omp_wait_policy)
    from amity.server.main import serve

    sys.exit(serve(from_namespace(EngineConfig, args), from_namespace(ServerConfig, args)))


def _suite(args: argparse.Namespace) -> None:
    from amity.suite.app import serve

    sys.exit(serve(from_namespace(SuiteConfig, args), from_namespace(StoreConfig, args)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="amity", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="print a completion of a prompt")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    add_arguments(gen, EngineConfig)
    gen.set_defaults(func=_generate)

    srv = commands.add_parser("serve", help="serve the Friendli Container API")
    add_arguments(srv, EngineConfig)
    add_arguments(srv, ServerConfig)
    srv.set_defaults(func=_serve)

    add_bench_parser(commands)

    suite = commands.add_parser("suite", help="serve the Friendli Suite platform API")
    add_arguments(suite, SuiteConfig)
    add_arguments(suite, StoreConfig)
    suite.set_defaults(func=_suite)
    add_admin_parser(commands)
    add_knowledge_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (FileNotFoundError, ValueError) as error:  # a bad model path or option: say so plainly
        parser.exit(2, f"amity: error: {error}\n")


if __name__ == "__main__":
    main()
