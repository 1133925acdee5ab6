"""A pipeline's per-sample copies of a layer: bound arrays and fixed data (``Layer.constants``)
are shared, everything else (forward caches) is the copy's own."""

from __future__ import annotations

import numpy as np

from hpcopt.nn import mlp
from hpcopt.pipeline.executor import _clone
from hpcopt.problems.l1_chain import l1_chain


def test_fixed_data_is_shared_not_copied():
    problem = l1_chain(blocks=2, block_dim=3, rows=12)
    params, grads = problem.params.copy(), np.zeros_like(problem.params)
    problem.model.bind(params, grads)
    layer = problem.model.layers[0]
    twin = _clone(layer)
    assert twin is not layer
    assert twin.matrix is layer.matrix
    assert twin.params["theta"] is layer.params["theta"]
    x = np.ones((1, 12))
    np.testing.assert_array_equal(twin.forward(x), layer.forward(x))


def test_forward_caches_stay_private():
    model = mlp(4, [3], 2)
    params = np.zeros(model.layout.size)
    model.init(params, np.random.default_rng(0))
    model.bind(params, np.zeros_like(params))
    layer = model.layers[0]
    twin = _clone(layer)
    assert twin.params["weight"] is layer.params["weight"]
    layer.forward(np.ones((1, 4)))
    twin.forward(np.zeros((1, 4)))
    cached = [k for k, v in vars(layer).items() if isinstance(v, np.ndarray)]
    assert cached and all(getattr(layer, k) is not getattr(twin, k) for k in cached)
