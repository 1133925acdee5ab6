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
from typing import Any

import numpy as np
import torch

from ..errors import HpcoptError
from ..io import READ_ERRORS, described
from ..io.data_parallel_checkpoint import TMP_SUFFIX
from ..io.safe_files import HDF5Writing, check_regular, publish, write_failure
from ..io.structure import open_for_reading

SAFETENSORS = ".safetensors"
STATE_DICT_KIND = "torch state_dict"  # the HDF5 file's "kind" attribute
TENSOR_KINDS = "biufc"  # NumPy dtype kinds a tensor can hold: bool, integers, floats, complex


def preferred_suffix() -> str:
    return SAFETENSORS if importlib.util.find_spec("safetensors") else ".h5"


def save_state_dict(model: torch.nn.Module | Mapping[str, torch.Tensor], path: str | Path) -> Path:
    """Write ``model``'s state_dict (or a state_dict) to ``path``; returns the path.

    The file is written as ``PATH.tmp`` and renamed over ``path``: an existing file, or a
    symbolic link, at ``path`` is replaced, never written through, and a failed write (a full
    disk: one HpcoptError line) leaves it as it was."""
    path = Path(path)
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    tensors = {name: t.detach().cpu().contiguous().clone() for name, t in state.items()}
    tmp = path.with_name(path.name + TMP_SUFFIX)
    if path.suffix == SAFETENSORS:
        from safetensors.torch import save_file

        tmp.unlink(missing_ok=True)  # never written through, as HDF5Writing does
        try:
            save_file(tensors, str(tmp))
            publish(tmp, path, STATE_DICT_KIND)
        except OSError as exc:  # writing the temporary file
            raise write_failure(path, STATE_DICT_KIND, exc) from None
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def fill(f: Any) -> None:
        f.attrs["kind"] = STATE_DICT_KIND
        for name, tensor in tensors.items():
            f.create_dataset(name, data=tensor.numpy())
        f.flush()

    writing = HDF5Writing(tmp, "w", STATE_DICT_KIND, path, track_order=True)
    try:
        writing.attempt(fill)
        writing.publish()
    finally:
        writing.abandon()  # nothing left to delete once published
    return path


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The state_dict ``save_state_dict`` wrote (CPU tensors, in the saved order), for
    ``module.load_state_dict``. HpcoptError (one line naming the file) for anything else: an
    HDF5 file must hold one plain numeric dataset per key at its root, and nothing that points
    outside it (``hpcopt.io.structure``), and is read only once that is known."""
    path = Path(path)
    if path.suffix == SAFETENSORS:
        from safetensors.torch import load_file

        try:
            check_regular(path, STATE_DICT_KIND)  # a FIFO would block the open for ever
        except FileNotFoundError:
            raise HpcoptError(f"{STATE_DICT_KIND} not found: {path}") from None
        return load_file(str(path))
    import h5py

    with open_for_reading(path, STATE_DICT_KIND) as f:
        if f.attrs.get("kind") != STATE_DICT_KIND:
            raise HpcoptError(f"{path} is not a state_dict written by hpcopt.torch.save_state_dict")
        tensors = {}
        for name in f:
            dataset = f[name]
            if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in TENSOR_KINDS:
                held = "a group" if isinstance(dataset, h5py.Group) else f"{dataset.dtype} values"
                raise HpcoptError(f"{path}: /{name} holds {held}, not a tensor (a state_dict file "
                                  "holds one numeric dataset per key at its root)")
            try:
                values = np.asarray(dataset[()])
            except READ_ERRORS as exc:
                raise HpcoptError(f"{path} is a damaged {STATE_DICT_KIND} ({described(exc)})") from None
            tensors[name] = torch.from_numpy(values.astype(values.dtype.newbyteorder("="), copy=False))
        return tensors
