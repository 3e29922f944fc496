"""Maps a checkpoint's `config.architectures` to our implementation."""

from amity.models.llama import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

MODEL_REGISTRY = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def model_class(config) -> type:
    architectures = getattr(config, "architectures", None) or []
    for name in architectures:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(
        f"unsupported architecture {architectures or '(none given)'}; "
        f"supported: {', '.join(sorted(MODEL_REGISTRY))}")
