"""Layers with forward and backward on views of flat parameter and gradient buffers."""

from .layers import Layer, Linear, ReLU, Tanh
from .losses import softmax_cross_entropy
from .models import mlp
from .sequential import Sequential

__all__ = ["Layer", "Linear", "ReLU", "Tanh", "Sequential", "mlp", "softmax_cross_entropy"]
