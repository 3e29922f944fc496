"""`instanceOptionId` -> a device profile. The ids are Friendli's (the spec lists them);
`cpu` is amity's own. A replica runs with `--device auto`: on the GPU where this
machine has one, else on the CPU, and the spec's `gpuType`/`numGpu` say which
(`CPU`, 0), not what the option would rent."""

from dataclasses import dataclass
from pathlib import Path

_GPUS = {"A100 80GB": ("ShbPuOs4tfGb", "mrAHuYt7T40o", "JkNob0NMdoF3", "sYH4kHmAcA5P"),
         "H100": ("TwD5AqnBSVN0", "zfTutSiLn0Hq", "lfkRz5G48REc", "GUA4qYFmsYz8"),
         "H200": ("LnK1wTaKc7WO", "Tu6GjBnfHPe4", "OhTzYtZuomzI", "ahBzWtOuomsI"),
         "B200": ("8GiQTLKfJNOr", "brTZGIuYgVrs", "AFoZMFXZnAdD", "drbc6G9FxJWZ")}
INSTANCE_OPTIONS: dict[str, tuple[str, int]] = {
    option: (f"NVIDIA {gpu}", count)
    for gpu, options in _GPUS.items() for option, count in zip(options, (1, 2, 4, 8))}
INSTANCE_OPTIONS["cpu"] = ("CPU", 0)


@dataclass(frozen=True)
class DeviceProfile:
    gpu_type: str
    num_gpu: int


def local_gpu_count() -> int:
    gpus = Path("/proc/driver/nvidia/gpus")
    return sum(1 for _ in gpus.iterdir()) if gpus.is_dir() else 0


def device_profile(option_id: str) -> DeviceProfile | None:
    """None for an unknown option."""
    if option_id not in INSTANCE_OPTIONS:
        return None
    gpu_type, count = INSTANCE_OPTIONS[option_id]
    available = local_gpu_count()
    if count == 0 or available == 0:
        return DeviceProfile("CPU", 0)
    return DeviceProfile(gpu_type, min(count, available))
