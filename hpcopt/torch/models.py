"""Ready-made modules for ``--model torch:hpcopt.torch.models:NAME``: the ResNet-20 of the
PR-SGD and CELGC papers' CIFAR-10 experiments (He et al. 2016, section 4.2: three stages of
three basic blocks, 16, 32 and 64 channels, batch norm, projection shortcuts where the shape
changes, global average pooling), for 1-channel and 3-channel images of any size >= 8x8, and
``resnet18``, shaped as torchvision's ResNet-18 (a 7x7 stride-2 stem and max pooling, four
stages of two basic blocks, 64-512 channels; 11,181,642 parameters for 10 classes), without
depending on torchvision.

``word_lstm`` is a word language model for ``hpcopt.torch.text`` (embedding, LSTM, decoder
tied to the embedding), the small cousin of the CELGC paper's AWD-LSTM, every window from a
zero state; ``word_lstm_carried`` is the same model carrying its state (h, c) from window to
window (truncated BPTT). Both take the vocabulary size: ``--model
torch:hpcopt.torch.models:word_lstm_carried`` on a text corpus, or ``functools.partial`` with
its other arguments for ``language_workload``; so does ``gpt``, a small GPT-2-style
decoder-only transformer (Radford et al. 2019: pre-norm blocks of causal self-attention and a
4x GELU MLP, learned positions, decoder tied to the embedding)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

#: An LSTM's state: (h, c), each (layers, batch, hidden).
LSTMState = tuple[torch.Tensor, torch.Tensor]


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the input (a 1x1 conv-BN when the shape changes), ReLU."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                          nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def resnet(depth: int = 20, channels: int = 1, classes: int = 10, width: int = 16) -> nn.Sequential:
    """ResNet-``depth`` (6n + 2 layers) for ``channels``-channel images."""
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"depth must be 6n + 2 with n >= 1, got {depth}")
    blocks, layers = (depth - 2) // 6, []
    inputs = width
    for stage in range(3):
        outputs = width * 2 ** stage
        for block in range(blocks):
            layers.append(BasicBlock(inputs, outputs, 2 if stage and not block else 1))
            inputs = outputs
    return nn.Sequential(nn.Conv2d(channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                         nn.ReLU(), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(inputs, classes))


def resnet20() -> nn.Sequential:
    """ResNet-20 for 1-channel images (MNIST, digits), 10 classes."""
    return resnet(20, channels=1)


def resnet20_rgb() -> nn.Sequential:
    """ResNet-20 for 3-channel images (CIFAR-10), 10 classes."""
    return resnet(20, channels=3)


def resnet18(channels: int = 3, classes: int = 10) -> nn.Sequential:
    """torchvision's ResNet-18 layout for ``channels``-channel images (each stage halves the
    size, from the stem's 1/4; 32x32 images reach the last stage at 1x1)."""
    layers: list[nn.Module] = [nn.Conv2d(channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                               nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    inputs = 64
    for stage in range(4):
        outputs = 64 * 2 ** stage
        layers += [BasicBlock(inputs, outputs, 2 if stage else 1), BasicBlock(outputs, outputs, 1)]
        inputs = outputs
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes))


class _WordLSTMLayers(nn.Module):
    """Embedding, ``layers`` LSTM layers, dropout, a linear decoder to vocabulary scores.

    With ``tied`` (the default; needs ``embedding == hidden``) the decoder's weight is the
    embedding's (Press and Wolf 2017), as in AWD-LSTM. Embedding and decoder are initialized
    uniform in [-0.1, 0.1], the decoder's bias zero (PyTorch's word language model).
    """

    def __init__(self, vocab: int, embedding: int = 200, hidden: int = 200, layers: int = 1,
                 dropout: float = 0.0, tied: bool = True) -> None:
        super().__init__()
        if tied and embedding != hidden:
            raise ValueError(f"tied weights need embedding == hidden, got {embedding} and {hidden}")
        self.embedding = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden, vocab)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tied:
            self.decoder.weight = self.embedding.weight
        else:
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def scores(self, tokens: torch.Tensor, state: LSTMState | None) -> tuple[torch.Tensor, LSTMState]:
        """(batch, time, vocab) scores of (batch, time) token ids from ``state`` (zeros: None),
        and the state (h, c) after the last token."""
        states, last = self.lstm(self.drop(self.embedding(tokens)), state)
        return self.decoder(self.drop(states)), last


class WordLSTM(_WordLSTMLayers):
    """``forward(tokens)``: (batch, time) token ids to (batch, time, vocab) scores, each window
    from a zero state."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.scores(tokens, None)[0]


class CarriedWordLSTM(_WordLSTMLayers):
    """``forward(tokens, state=None) -> (scores, (h, c))``: the word LSTM carrying its state,
    each (layers, batch, hidden), from one window to the next; the same parameters (and
    state_dict keys) as ``WordLSTM``."""

    def forward(self, tokens: torch.Tensor,
                state: LSTMState | None = None) -> tuple[torch.Tensor, LSTMState]:
        return self.scores(tokens, state)


def word_lstm(vocab: int = 10000, embedding: int = 200, hidden: int = 200, layers: int = 1,
              dropout: float = 0.0, tied: bool = True) -> WordLSTM:
    """A word LSTM for a ``vocab``-word corpus (10,000: Penn Treebank)."""
    return WordLSTM(vocab, embedding, hidden, layers, dropout, tied)


class CausalBlock(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)): causal multi-head self-attention, 4x GELU MLP."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = (part.view(batch, time, self.heads, -1).transpose(1, 2)
                   for part in self.qkv(self.ln1(x)).split(width, dim=2))
        attended = functional.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, width))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and learned position embeddings, ``layers`` causal blocks, a final layer norm and
    a decoder tied to the token embedding (no bias), GPT-2's initialization (normal, std 0.02).

    ``forward(tokens)``: (batch, time) token ids, time <= ``context``, to (batch, time, vocab)
    scores, each position from the tokens up to it."""

    def __init__(self, vocab: int, width: int = 128, layers: int = 2, heads: int = 4,
                 context: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        self.context = context
        self.embedding, self.position = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(CausalBlock(width, heads, dropout) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.decoder = nn.Linear(width, vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        self.decoder.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.context:
            raise ValueError(f"windows of {tokens.shape[1]} tokens, the context is {self.context}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.embedding(tokens) + self.position(positions))
        return self.decoder(self.ln(self.blocks(x)))


def gpt(vocab: int = 10000, width: int = 128, layers: int = 2, heads: int = 4, context: int = 64,
        dropout: float = 0.0) -> GPT:
    """A GPT-style language model for a ``vocab``-word corpus (windows of up to ``context``)."""
    return GPT(vocab, width, layers, heads, context, dropout)


def word_lstm_carried(vocab: int = 10000, embedding: int = 200, hidden: int = 200, layers: int = 1,
                      dropout: float = 0.0, tied: bool = True) -> CarriedWordLSTM:
    """``word_lstm`` carrying its state across windows (truncated BPTT)."""
    return CarriedWordLSTM(vocab, embedding, hidden, layers, dropout, tied)
