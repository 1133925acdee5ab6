"""Cutting a sequential model into stages: balanced split, explicit bounds, trainable blocks."""

import itertools

import numpy as np
import pytest

from hpcopt.errors import HpcoptError
from hpcopt.nn import Linear, ReLU, Sequential, mlp
from hpcopt.nn.perturbation import AdditivePerturbation
from hpcopt.pipeline import StagePlan
from hpcopt.pipeline.split import _param_count


def loads(model, plan):
    return [sum(_param_count(layer) for layer in plan.layers(model, s))
            for s in range(plan.num_stages)]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_balanced_split_is_optimal_and_keeps_activations_with_their_layer(stages):
    model = mlp(30, [50, 8, 40, 20], 5)  # 9 layers, 5 parameter blocks of uneven size
    plan = StagePlan.balanced(model, stages)
    assert plan.num_stages == stages and plan.bounds[0] == 0 and plan.bounds[-1] == 9
    for s in range(1, stages):
        assert isinstance(model.layers[plan.bounds[s]], Linear)  # cut before a parameter layer
    cuts = [0, 2, 4, 6, 8]  # before fc2..fc5
    best = min(max(loads(model, StagePlan((0, *c, 9))))
               for c in itertools.combinations(cuts[1:], stages - 1))
    assert max(loads(model, plan)) == best


def test_param_slices_tile_the_flat_vector_in_layer_order():
    model = mlp(6, [5, 4], 3)
    plan = StagePlan.explicit(model, [2, 3])
    slices = [plan.param_slice(model, s) for s in range(3)]
    assert slices == [slice(0, 35), slice(35, 59), slice(59, 74)]
    assert slices[-1].stop == model.layout.size
    assert [layer.name for layer in plan.layers(model, 1)] == ["fc2"]


def test_bad_splits_are_user_errors():
    model = mlp(6, [5], 3)
    with pytest.raises(HpcoptError, match="explicit stage boundaries"):
        StagePlan.balanced(model, 3)
    with pytest.raises(HpcoptError, match="layer indices in 1..2"):
        StagePlan.explicit(model, [3])
    with pytest.raises(HpcoptError, match="rise strictly"):
        StagePlan.explicit(model, [2, 2])


def test_trainable_slice_with_frozen_layers():
    model = Sequential([AdditivePerturbation((2, 6), name="delta"), Linear(6, 5, name="fc1"),
                        ReLU(), Linear(5, 3, name="fc2")])
    plan = StagePlan.explicit(model, [3])
    frozen = {"fc1", "fc2"}
    assert plan.trainable_slice(model, 0, frozen) == slice(0, 12)
    assert plan.trainable_slice(model, 1, frozen) == slice(0, 0)
    assert plan.trainable_slice(model, 0, ()) == slice(0, 12 + 35)
    assert plan.trainable_slice(model, 0, {"delta"}) == slice(12, 47)
    with pytest.raises(HpcoptError, match="not contiguous"):
        StagePlan((0, 4)).trainable_slice(model, 0, {"fc1"})
    with pytest.raises(HpcoptError, match="no layer"):
        plan.trainable_slice(model, 0, {"fc9"})


def test_additive_perturbation_gradient_sums_over_broadcast_axes():
    layer = AdditivePerturbation((3,))
    params, grads = {"delta": np.arange(3.0)}, {"delta": np.zeros(3)}
    layer.bind(params, grads)
    x = np.ones((4, 3))
    np.testing.assert_array_equal(layer.forward(x), x + np.arange(3.0))
    dy = np.arange(12.0).reshape(4, 3)
    assert layer.backward(dy) is dy
    np.testing.assert_array_equal(grads["delta"], dy.sum(axis=0))


def test_world_size_check_names_the_launch_command():
    plan = StagePlan.explicit(mlp(6, [5, 4], 3), [2, 4])
    plan.check_world_size(3)
    with pytest.raises(HpcoptError, match="runs on 2 rank\\(s\\): launch with mpiexec -n 3"):
        plan.check_world_size(2)
