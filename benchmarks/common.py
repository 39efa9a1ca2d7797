"""What the GPU benchmark scripts share."""


def gpu_slug() -> str:
    """The current CUDA device's name as a results-file slug ("NVIDIA H200" -> "h200")."""
    import torch

    return torch.cuda.get_device_name().lower().replace("nvidia", "").strip().replace(" ", "-")
