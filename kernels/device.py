"""The device properties the launch plans read: the SM count and the shared memory an SM
holds."""

from __future__ import annotations

import functools

import torch
from ssvkit.perfmodel.attention_plan import DEFAULT_SMEM_PER_SM_BYTES

# H100 SXM and H200 both have 132 SMs and Hopper's shared memory an SM
# (``DEFAULT_SMEM_PER_SM_BYTES``), so interpreter runs on the CPU plan the GPU's launches.
CPU_NUM_SMS = 132


def num_sms(device: torch.device | int) -> int:
    """SM count of ``device`` (a device or a CUDA index; read once per device and cached);
    ``CPU_NUM_SMS`` off the GPU."""
    if isinstance(device, int):
        return _cuda_sms(device)
    if device.type != "cuda":
        return CPU_NUM_SMS
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def smem_per_sm(device: torch.device) -> int:
    """Shared memory one SM of ``device`` holds, in bytes (read once per device and cached);
    ``DEFAULT_SMEM_PER_SM_BYTES`` off the GPU."""
    if device.type != "cuda":
        return DEFAULT_SMEM_PER_SM_BYTES
    return _cuda_smem(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_smem(index: int) -> int:
    props = torch.cuda.get_device_properties(index)
    return int(props.shared_memory_per_multiprocessor)
