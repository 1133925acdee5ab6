"""Train a user's own ``torch.nn.Module`` with hpcopt's data-parallel algorithms.

``TorchModel`` makes the module's trained parameters and their gradients views of two flat
vectors (the algorithm's ``state.x`` and ``state.grad``), ``TorchProblem`` is the gradient
oracle over this rank's data, ``torch_workload`` assembles both into a ``hpcopt.Workload``
for ``hpcopt.train`` (``language_workload``: a language model on a corpus's token ids), and
``save_state_dict``/``load_state_dict`` export a trained model without pickle.
See docs/torch.md. Needs PyTorch: ``pip install 'hpcopt[torch]'``; ``import hpcopt`` alone
never loads it.
"""

try:
    import torch  # noqa: F401 - fail here, with the way out, rather than deep inside a module
except ImportError as exc:  # pragma: no cover - only where PyTorch is missing
    raise ImportError("hpcopt.torch needs PyTorch, which is not installed: "
                      "pip install 'hpcopt[torch]' (see docs/torch.md)") from exc

from .adapter import TorchModel
from .build import prepared_model, torch_workload
from .data import BatchFactory, IteratorSampler, TensorData
from .export import load_state_dict, save_state_dict
from .from_config import config_workload, load_factory
from .problem import TorchProblem
from .text import evaluate_tokens, language_workload

__all__ = ["TorchModel", "TorchProblem", "torch_workload", "prepared_model", "config_workload",
           "load_factory", "TensorData", "BatchFactory", "IteratorSampler", "save_state_dict",
           "load_state_dict", "language_workload", "evaluate_tokens"]
