"""Random-weight LoRA adapters built with `peft` on the tiny test checkpoints."""

from pathlib import Path

import torch
import transformers
from peft import LoraConfig, get_peft_model

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Three adapters that differ in what they exercise: every target at rank 8; q/v only
# at rank 4 with rsLoRA; the MLP at the full rank with one module's rank changed.
ADAPTER_SPECS = {
    "full": dict(r=8, lora_alpha=16, target_modules=ALL_TARGETS),
    "qv-rslora": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True),
    "mlp": dict(r=16, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"],
                rank_pattern={"down_proj": 2}),
}


def peft_model(base_path: Path, spec: dict, seed: int, auto_class=transformers.AutoModelForCausalLM):
    """`peft`'s model over the base checkpoint (loaded by `auto_class`) with a
    random-weight adapter (B too: PEFT's default B = 0 would make the adapter a no-op)."""
    hf = auto_class.from_pretrained(str(base_path), dtype=torch.float32)
    model = get_peft_model(hf, LoraConfig(**spec, init_lora_weights=False))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model.eval()


def build_adapter(base_path: Path, directory: Path, spec: dict, seed: int,
                  auto_class=transformers.AutoModelForCausalLM) -> Path:
    peft_model(base_path, spec, seed, auto_class).save_pretrained(str(directory))
    return directory
