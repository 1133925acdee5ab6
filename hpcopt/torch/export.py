"""A trained model as a torch state_dict on disk, without pickle: safetensors or plain HDF5.

The file's suffix decides the format: ``.safetensors`` (needs the safetensors package; read
by ``safetensors.torch.load_file`` anywhere), anything else HDF5, one dataset per state_dict
key at the file's root (readable with h5py alone). ``preferred_suffix()`` is ``.safetensors``
where the package is installed, else ``.h5``. Tensors are written as contiguous CPU copies,
so views of hpcopt's flat vectors and tied parameters are saved like any tensors.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

SAFETENSORS = ".safetensors"
STATE_DICT_KIND = "torch state_dict"  # the HDF5 file's "kind" attribute


def preferred_suffix() -> str:
    return SAFETENSORS if importlib.util.find_spec("safetensors") else ".h5"


def save_state_dict(model: torch.nn.Module | Mapping[str, torch.Tensor], path: str | Path) -> Path:
    """Write ``model``'s state_dict (or a state_dict) to ``path``; returns the path."""
    path = Path(path)
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    tensors = {name: t.detach().cpu().contiguous().clone() for name, t in state.items()}
    if path.suffix == SAFETENSORS:
        from safetensors.torch import save_file

        save_file(tensors, str(path))
        return path
    import h5py

    with h5py.File(path, "w", track_order=True) as f:
        f.attrs["kind"] = STATE_DICT_KIND
        for name, tensor in tensors.items():
            f.create_dataset(name, data=tensor.numpy())
    return path


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The state_dict ``save_state_dict`` wrote (CPU tensors, in the saved order), for
    ``module.load_state_dict``."""
    path = Path(path)
    if path.suffix == SAFETENSORS:
        from safetensors.torch import load_file

        return load_file(str(path))
    import h5py

    with h5py.File(path, "r") as f:
        if f.attrs.get("kind") != STATE_DICT_KIND:
            raise ValueError(f"{path} is not a state_dict written by hpcopt.torch.save_state_dict")
        return {name: torch.from_numpy(np.array(f[name][()])) for name in f}
