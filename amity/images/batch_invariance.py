"""Make a pipeline's numbers independent of what else shares its batch, on a CPU.

An image must be the same bytes whether it ran alone or batched with others. The
float results of three CPU kernels depend on the batch around a row: a matrix product
of few rows takes another kernel than one of many (MKL's small-M paths), oneDNN picks
its convolution algorithm by batch size, and the VAE's group norms split their work
by batch. So: linear layers always multiply at least `MIN_ROWS` rows (zero padding),
convolutions run through ATen's own kernel, which convolves each image alone
(`torch.backends.mkldnn` off while a batch runs), and the VAE decodes (and encodes)
one image at a time (diffusers' slicing). Measured on the tiny pipeline: bitwise equal
images at batch sizes 1-5, with and without classifier-free guidance. On a GPU none of
this is applied (cuBLAS and cuDNN make no such promise either; see the README).
"""

import contextlib

import torch
from torch import nn

MIN_ROWS = 16  # from 12 rows on, MKL's sgemm gave the same row results as at 64


class RowStableLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] >= MIN_ROWS:
            return super().forward(x)
        padded = torch.cat([rows, rows.new_zeros(MIN_ROWS - rows.shape[0], rows.shape[1])])
        return super().forward(padded)[: rows.shape[0]].reshape(*x.shape[:-1], -1)


def make_batch_invariant(pipe) -> None:
    """Convert `pipe`'s linear layers in place (same weights) and slice its VAE."""
    for component in pipe.components.values():
        if isinstance(component, nn.Module):
            for module in component.modules():
                if type(module) is nn.Linear:
                    module.__class__ = RowStableLinear
    vae = getattr(pipe, "vae", None)
    if vae is not None and hasattr(vae, "enable_slicing"):
        vae.enable_slicing()


@contextlib.contextmanager
def invariant_kernels(enabled: bool):
    """The context a batch runs in: oneDNN off when `enabled` (the flag is global, and
    the image thread is the process's only user of torch)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = before and not enabled
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before
