"""Layers with forward and backward on views of flat parameter and gradient buffers."""

from .batchnorm import BatchNorm
from .conv import Conv2d
from .embedding import Embedding
from .language_model import LSTMLanguageModel
from .layers import Layer, Linear, ReLU, Tanh
from .losses import softmax_cross_entropy
from .lstm import LSTM
from .models import mlp, plain_cnn, resnet
from .pooling import AvgPool2d, Flatten, GlobalAvgPool2d, MaxPool2d
from .residual import Residual, ShortcutA
from .sequential import Sequential

__all__ = ["Layer", "Linear", "ReLU", "Tanh", "Conv2d", "MaxPool2d", "AvgPool2d",
           "GlobalAvgPool2d", "Flatten", "BatchNorm", "Residual", "ShortcutA", "Sequential",
           "mlp", "resnet", "plain_cnn", "softmax_cross_entropy", "Embedding", "LSTM",
           "LSTMLanguageModel"]
