"""One LSTM layer over a whole sequence, with truncated back-propagation through time.

Per time step t, for a batch of B rows, with [.,.] concatenation along features::

    z_t = [x_t, h_{t-1}] W + b                      W: (inputs + hidden, 4 hidden)
    i, f, o = sigmoid(z_t[gates i, f, o]);  g = tanh(z_t[gate g])      (gate order i, f, o, g)
    c_t = f * c_{t-1} + i * g
    h_t = o * tanh(c_t)

The input part x_t W_x of all T steps is one (T B, inputs) x (inputs, 4 hidden) matmul; only
h_{t-1} W_h runs inside the Python loop over time. The initial state (h_0, c_0) is a constant
(carried over from the previous window, detached): no gradient flows into it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module
from .layers import Layer

Array = Any
State = tuple[Array, Array]


def _sigmoid_(z: Array, xp: Any) -> Array:
    """sigmoid(z) = (1 + tanh(z / 2)) / 2 in place: no overflow for large |z|."""
    z *= 0.5
    xp.tanh(z, out=z)
    z += 1
    z *= 0.5
    return z


class LSTM(Layer):
    """One LSTM layer; ``forward`` maps (T, B, inputs) to (T, B, hidden).

    Parameters: ``weight`` (inputs + hidden, 4 hidden), rows of x first, then of h; ``bias``
    (4 hidden,). Initialization uniform(-1/sqrt(hidden), 1/sqrt(hidden)) as in PyTorch.
    """

    def __init__(self, inputs: int, hidden: int, name: str = "lstm") -> None:
        if inputs < 1 or hidden < 1:
            raise ValueError(f"LSTM needs positive sizes, got {inputs} -> {hidden}")
        self.inputs, self.hidden, self.name = inputs, hidden, name
        self.final_state: State | None = None

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("weight", (self.inputs + self.hidden, 4 * self.hidden)),
                ("bias", (4 * self.hidden,))]

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        bound = 1.0 / np.sqrt(self.hidden)
        xp = array_module(params["weight"])
        for key in ("weight", "bias"):
            params[key][...] = xp.asarray(rng.uniform(-bound, bound, size=params[key].shape))

    def zero_state(self, batch: int, xp: Any, dtype: Any) -> State:
        """(h, c) of zeros for ``batch`` sequences."""
        return xp.zeros((batch, self.hidden), dtype), xp.zeros((batch, self.hidden), dtype)

    def forward(self, x: Array, train: bool = True, state: State | None = None) -> Array:
        """Outputs h_1..h_T, shape (T, B, hidden); ``state`` is (h_0, c_0), zeros when None.

        Afterwards ``final_state`` holds (h_T, c_T) (new arrays, safe to keep).
        """
        xp = array_module(x)
        steps, batch, _ = x.shape
        hidden = self.hidden
        weight = self.params["weight"]
        w_x, w_h = weight[: self.inputs], weight[self.inputs:]
        if state is None:
            state = self.zero_state(batch, xp, weight.dtype)
        gates = (x.reshape(steps * batch, self.inputs) @ w_x).reshape(steps, batch, 4 * hidden)
        gates += self.params["bias"]
        h = xp.empty((steps + 1, batch, hidden), dtype=weight.dtype)
        c = xp.empty_like(h)
        tanh_c = xp.empty((steps, batch, hidden), dtype=weight.dtype)
        h[0], c[0] = state
        for t in range(steps):
            z = gates[t]
            z += h[t] @ w_h
            _sigmoid_(z[:, : 3 * hidden], xp)
            xp.tanh(z[:, 3 * hidden:], out=z[:, 3 * hidden:])
            i, f, o, g = (z[:, k * hidden:(k + 1) * hidden] for k in range(4))
            xp.multiply(f, c[t], out=c[t + 1])
            c[t + 1] += i * g
            xp.tanh(c[t + 1], out=tanh_c[t])
            xp.multiply(o, tanh_c[t], out=h[t + 1])
        self._x, self._gates, self._h, self._c, self._tanh_c = x, gates, h, c, tanh_c
        self.final_state = (h[steps].copy(), c[steps].copy())
        return h[1:]

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        """Back-propagate dL/dh_1..h_T (T, B, hidden) through time; writes dL/dW and dL/db."""
        xp = array_module(dy)
        steps, batch, hidden = dy.shape
        w_h = self.params["weight"][self.inputs:]
        gates, c, tanh_c = self._gates, self._c, self._tanh_c
        dz = xp.empty_like(gates)
        dh = xp.zeros((batch, hidden), dtype=dy.dtype)  # dL/dh_t from step t + 1
        dc = xp.zeros_like(dh)                          # dL/dc_t from step t + 1
        for t in range(steps - 1, -1, -1):
            i, f, o, g = (gates[t, :, k * hidden:(k + 1) * hidden] for k in range(4))
            dh += dy[t]
            dc += dh * o * (1 - tanh_c[t] * tanh_c[t])
            d = dz[t]
            xp.multiply(dc * g, i * (1 - i), out=d[:, :hidden])
            xp.multiply(dc * c[t], f * (1 - f), out=d[:, hidden:2 * hidden])
            xp.multiply(dh * tanh_c[t], o * (1 - o), out=d[:, 2 * hidden:3 * hidden])
            xp.multiply(dc * i, 1 - g * g, out=d[:, 3 * hidden:])
            dc *= f
            if t:
                xp.matmul(d, w_h.T, out=dh)
        flat_dz = dz.reshape(steps * batch, 4 * hidden)
        grad_w = self.grads["weight"]
        xp.matmul(self._x.reshape(steps * batch, self.inputs).T, flat_dz,
                  out=grad_w[: self.inputs])
        xp.matmul(self._h[:-1].reshape(steps * batch, hidden).T, flat_dz,
                  out=grad_w[self.inputs:])
        flat_dz.sum(axis=0, out=self.grads["bias"])
        if not need_input_grad:
            return None
        w_x = self.params["weight"][: self.inputs]
        return (flat_dz @ w_x.T).reshape(steps, batch, self.inputs)
