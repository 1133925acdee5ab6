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
        # W_h^T once, contiguous, for the T matmuls of the loop
        w_h_t = xp.ascontiguousarray(self.params["weight"][self.inputs:].T)
        dz, to_c, f = self._local_derivatives()
        dz4 = dz.reshape(steps, batch, 4, hidden)
        dh = xp.zeros((batch, hidden), dtype=dy.dtype)  # dL/dh_t from step t + 1
        dc = xp.zeros_like(dh)                          # dL/dc_t from step t + 1
        for t in range(steps - 1, -1, -1):
            dh += dy[t]
            to_c[t] *= dh
            dc += to_c[t]                   # dc_t = dc_{t+1} f_{t+1} + dh_t o_t (1 - tanh^2 c_t)
            dz4[t, :, :2] *= dc[:, None]    # dz_i, dz_f
            dz4[t, :, 2] *= dh              # dz_o
            dz4[t, :, 3] *= dc              # dz_g
            dc *= f[t]
            if t:
                xp.matmul(dz[t], w_h_t, out=dh)
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

    def _local_derivatives(self) -> tuple[Array, Array, Array]:
        """For all T steps at once, from the forward pass: P (T, B, 4 hidden), with
        dz_{i,f,g} = dc_t * P_{i,f,g} and dz_o = dh_t * P_o (gate order i, f, o, g)::

            P_i = g i (1 - i),  P_f = c_{t-1} f (1 - f),  P_o = tanh(c_t) o (1 - o),
            P_g = i (1 - g^2);

        Q = o (1 - tanh^2 c_t) (T, B, hidden), the path dh_t -> dc_t; and the forget gates f.
        ``backward`` scales them in place, so its time loop runs few, large-enough ops."""
        xp = array_module(self._gates)
        hidden, gates, tanh_c = self.hidden, self._gates, self._tanh_c
        i, f, o, g = (gates[..., k * hidden:(k + 1) * hidden] for k in range(4))
        p = xp.empty_like(gates)
        sig = p[..., :3 * hidden]
        xp.subtract(1, gates[..., :3 * hidden], out=sig)
        sig *= gates[..., :3 * hidden]                  # s (1 - s) for i, f, o
        p[..., :hidden] *= g
        p[..., hidden:2 * hidden] *= self._c[:-1]
        p[..., 2 * hidden:3 * hidden] *= tanh_c
        xp.multiply(g, g, out=p[..., 3 * hidden:])
        xp.subtract(1, p[..., 3 * hidden:], out=p[..., 3 * hidden:])
        p[..., 3 * hidden:] *= i
        q = tanh_c * tanh_c
        xp.subtract(1, q, out=q)
        q *= o
        return p, q, f
