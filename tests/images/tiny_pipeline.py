"""Tiny random-weight Stable Diffusion pipelines in diffusers' directory layout, built
offline in seconds (no hub): a UNet2DConditionModel, an AutoencoderKL, a CLIPTextModel
with a byte-level CLIP tokenizer written here, a DDIM scheduler and, on request, a
ControlNet. Their images are noise: good for the API, shapes, formats, seeds and
batching, not for quality. The benchmark builds the same one."""

from pathlib import Path

import torch
from diffusers import (AutoencoderKL, ControlNetModel, DDIMScheduler,
                       StableDiffusionControlNetPipeline, StableDiffusionInpaintPipeline,
                       StableDiffusionPipeline,
                       UNet2DConditionModel)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

SAMPLE_SIZE = 16  # latent side; the VAE (two blocks) doubles it: 32-pixel images by default
TEXT_DIM = 32


def _tokenizer() -> CLIPTokenizer:
    """A CLIP BPE tokenizer with the 256 byte symbols (each also as a word end) and no
    merges: every character a token."""
    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def _unet(in_channels: int = 4) -> UNet2DConditionModel:
    return UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=SAMPLE_SIZE,
        in_channels=in_channels, out_channels=4, norm_num_groups=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=TEXT_DIM, attention_head_dim=4)


def _components(in_channels: int) -> dict:
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4,
        norm_num_groups=4, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        hidden_size=TEXT_DIM, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
        vocab_size=514, bos_token_id=512, eos_token_id=513, pad_token_id=513,
        max_position_embeddings=77))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    return dict(unet=_unet(in_channels), vae=vae, text_encoder=text_encoder,
                tokenizer=_tokenizer(), scheduler=scheduler,
                safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def build_text_to_image(directory: Path, inpainting: bool = False) -> Path:
    """A text-to-image pipeline (img2img and inpainting run on it too); with
    `inpainting`, an inpainting model (a UNet of 9 input channels)."""
    pipeline_cls = StableDiffusionInpaintPipeline if inpainting else StableDiffusionPipeline
    pipeline_cls(**_components(9 if inpainting else 4)).save_pretrained(directory)
    return directory


def build_controlnet(directory: Path) -> Path:
    components = _components(4)
    torch.manual_seed(1)
    controlnet = ControlNetModel(
        block_out_channels=(8, 16), layers_per_block=1, in_channels=4, norm_num_groups=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), cross_attention_dim=TEXT_DIM,
        attention_head_dim=4, conditioning_embedding_out_channels=(8, 16))
    # A ControlNet starts with zero convolutions (no effect until trained): random ones,
    # so the control image and its weight change the image.
    with torch.no_grad():
        for name, param in controlnet.named_parameters():
            if name.startswith(("controlnet_down_blocks", "controlnet_mid_block",
                                "controlnet_cond_embedding.conv_out")):
                param.normal_(std=0.2)
    StableDiffusionControlNetPipeline(controlnet=controlnet, **components).save_pretrained(directory)
    return directory
