"""A word- or character-level LSTM language model on one flat parameter buffer.

    e_t = E[w_t]                          Embedding (vocab, embed)
    h^l_t = LSTM_l(h^{l-1}_t)             ``layers`` stacked LSTMs, h^0 = e
    logits_t = h^L_t D + b                decoder D: (last hidden, vocab), or E^T when tied
    loss = mean over all T x B positions of -log softmax(logits_t)[w_{t+1}]

Truncated BPTT: a window of T steps is back-propagated on its own; the final (h, c) of every
layer is returned and passed into the next window as a constant. With ``tie`` (Press & Wolf,
Inan et al. 2017) the decoder uses the embedding matrix: ONE parameter in the flat buffer,
whose gradient is the sum of both uses; the last LSTM layer then has ``embed`` units (as in
AWD-LSTM), the others ``hidden``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import array_module
from ..flat import ParamLayout
from .embedding import Embedding
from .layers import Linear
from .losses import softmax_cross_entropy
from .lstm import LSTM, State

Array = Any


class LSTMLanguageModel:
    """Embedding -> LSTM x layers -> Linear decoder (optionally tied) -> softmax cross-entropy.

    Flat layout names: ``embedding.weight``, ``lstm{l}.weight``, ``lstm{l}.bias`` (l = 1..L),
    ``decoder.weight`` (untied only), ``decoder.bias``.
    """

    def __init__(self, vocab: int, embed: int, hidden: int, layers: int = 1,
                 tie: bool = False) -> None:
        if min(vocab, embed, hidden, layers) < 1:
            raise ValueError(f"LSTMLanguageModel needs positive sizes, got vocab {vocab}, "
                             f"embed {embed}, hidden {hidden}, layers {layers}")
        self.vocab, self.tie = vocab, tie
        self.embedding = Embedding(vocab, embed, name="embedding")
        sizes = [embed] + [hidden] * (layers - 1) + [embed if tie else hidden]
        self.lstms = [LSTM(n_in, n_out, name=f"lstm{i + 1}")
                      for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]))]
        self.decoder = Linear(sizes[-1], vocab, name="decoder")
        entries: list[tuple[str, tuple[int, ...]]] = [("embedding.weight", (vocab, embed))]
        for lstm in self.lstms:
            entries += [(f"{lstm.name}.{p}", shape) for p, shape in lstm.param_shapes()]
        if not tie:
            entries.append(("decoder.weight", (sizes[-1], vocab)))
        entries.append(("decoder.bias", (vocab,)))
        self.layout = ParamLayout.from_items(entries)
        # the arrays last bound, held so their ids cannot be reused by new arrays meanwhile
        self._bound: tuple[Array, Array] | None = None

    def init(self, params: Array, rng: np.random.Generator) -> None:
        """Embedding and (untied) decoder uniform(-0.1, 0.1), decoder bias 0, LSTMs as PyTorch."""
        views = self.layout.views(params)
        self.embedding.init_params({"weight": views["embedding.weight"]}, rng)
        for lstm in self.lstms:
            lstm.init_params(self._layer_views(views, lstm.name), rng)
        if not self.tie:
            w = rng.uniform(-0.1, 0.1, size=views["decoder.weight"].shape)
            views["decoder.weight"][...] = array_module(params).asarray(w)
        views["decoder.bias"][...] = 0

    def _layer_views(self, views: dict[str, Array], name: str) -> dict[str, Array]:
        return {key[len(name) + 1:]: v for key, v in views.items() if key.startswith(name + ".")}

    def _decoder_views(self, views: dict[str, Array]) -> dict[str, Array]:
        weight = views["embedding.weight"].T if self.tie else views["decoder.weight"]
        return {"weight": weight, "bias": views["decoder.bias"]}

    def bind(self, params: Array, grads: Array) -> None:
        """Point every layer at views of ``params`` and ``grads`` (cheap when already bound)."""
        if self._bound is not None and self._bound[0] is params and self._bound[1] is grads:
            return
        pviews, gviews = self.layout.views(params), self.layout.views(grads)
        self.embedding.bind(self._layer_views(pviews, "embedding"),
                            self._layer_views(gviews, "embedding"))
        for lstm in self.lstms:
            lstm.bind(self._layer_views(pviews, lstm.name), self._layer_views(gviews, lstm.name))
        self.decoder.bind(self._decoder_views(pviews), self._decoder_views(gviews))
        self._bound = (params, grads)

    def initial_state(self, batch: int, xp: Any = np, dtype: Any = np.float64) -> list[State]:
        """Zero (h, c) of every layer for ``batch`` sequences."""
        return [lstm.zero_state(batch, xp, dtype) for lstm in self.lstms]

    def _forward(self, inputs: Array, targets: Array,
                 state: Sequence[State]) -> tuple[Array, Array, list[State]]:
        y = self.embedding.forward(inputs)
        new_state: list[State] = []
        for lstm, layer_state in zip(self.lstms, state):
            y = lstm.forward(y, state=layer_state)
            assert lstm.final_state is not None  # forward has just set it
            new_state.append(lstm.final_state)
        steps, batch, width = y.shape
        logits = self.decoder.forward(y.reshape(steps * batch, width))
        loss, dlogits = softmax_cross_entropy(logits, targets.reshape(-1))
        return loss, dlogits, new_state

    def loss_and_grad(self, params: Array, grads: Array, inputs: Array, targets: Array,
                      state: Sequence[State]) -> tuple[Array, list[State]]:
        """Mean next-token cross-entropy over the (T, B) window and its gradient, written into
        ``grads`` (every entry overwritten); returns (loss, the state after the window)."""
        self.bind(params, grads)
        loss, dlogits, new_state = self._forward(inputs, targets, state)
        steps, batch = inputs.shape
        dx = self.decoder.backward(dlogits)
        assert dx is not None  # need_input_grad (the default): the input gradient is returned
        dy = dx.reshape(steps, batch, -1)
        for i in range(len(self.lstms) - 1, -1, -1):
            dy = self.lstms[i].backward(dy)
        self.embedding.backward(dy, accumulate=self.tie)  # tied: decoder wrote its part first
        return loss, new_state

    def loss(self, params: Array, scratch_grads: Array, inputs: Array, targets: Array,
             state: Sequence[State]) -> tuple[Array, list[State]]:
        """Mean cross-entropy of the window, forward only; ``scratch_grads`` is not written."""
        self.bind(params, scratch_grads)
        loss, _, new_state = self._forward(inputs, targets, state)
        return loss, new_state
