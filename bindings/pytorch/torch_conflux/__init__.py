"""Conflux as a torch.distributed backend for CPU tensors.

``import torch_conflux`` registers the backend "conflux"; then
``torch.distributed.init_process_group("conflux", ...)`` and
``torch.distributed.new_group(..., backend="conflux")`` use it.
See docs/pytorch.md.
"""
import torch
import torch.distributed as dist

from ._C import create_process_group

__all__ = ["create_process_group", "BACKEND"]

BACKEND = "conflux"

if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    dist.Backend.register_backend(BACKEND, create_process_group)
