"""Random crop with padding and horizontal flip: exact windows, seeded per (seed, rank, epoch,
batch), and the hook in the classification oracle, on NumPy and CuPy."""

import numpy as np
import pytest

from hpcopt.backend import get_backend
from hpcopt.data.augment import Augmentation, crop_flip
from hpcopt.data.sampler import MinibatchSampler
from hpcopt.errors import HpcoptError
from hpcopt.nn import plain_cnn
from hpcopt.problems.classification import ClassificationProblem
from tests.conftest import host


def images(n=6, c=2, h=5, w=4, dtype=np.float64):
    return (np.arange(n * c * h * w) + 1).reshape(n, c, h, w).astype(dtype)


def test_crop_flip_takes_a_mirrored_window_of_the_zero_padded_image(xp):
    x_host = images()
    x = xp.asarray(x_host)
    pad = 2
    top, left = np.array([0, 4, 2, 1, 3, 0]), np.array([4, 0, 2, 3, 1, 1])
    flip = np.array([False, True, False, True, True, False])
    out = crop_flip(x, top, left, flip, pad)
    out_host = host(out)
    for n in range(x.shape[0]):
        padded = np.pad(x_host[n], ((0, 0), (pad, pad), (pad, pad)))
        window = padded[:, top[n]:top[n] + 5, left[n]:left[n] + 4]
        np.testing.assert_array_equal(out_host[n], window[:, :, ::-1] if flip[n] else window)
    assert out.shape == x.shape and out.dtype == x.dtype
    unmoved = crop_flip(x, top * 0 + 2, left * 0 + 2, flip * False, 2)
    np.testing.assert_array_equal(host(unmoved), x_host)


def test_draws_are_a_function_of_seed_rank_epoch_and_batch(xp):
    x = xp.asarray(images(n=64, dtype=np.float32))
    a = Augmentation(seed=1, rank=0)
    expected = host(a(x, 3, 5))
    np.testing.assert_array_equal(host(Augmentation(seed=1, rank=0)(x, 3, 5)), expected)
    for other in (Augmentation(1, 1)(x, 3, 5), a(x, 4, 5), a(x, 3, 6), Augmentation(2, 0)(x, 3, 5)):
        assert not np.array_equal(host(other), expected)
    top, left, flip = a.draws(4000, 0, 0)
    assert set(top) == set(left) == set(range(9))  # offsets 0..2 pad
    assert 0.45 < flip.mean() < 0.55
    assert a(x, 0, 0).dtype == np.float32


def test_no_padding_and_no_flip_is_the_identity(xp):
    x_host = images()
    x = xp.asarray(x_host)
    np.testing.assert_array_equal(host(Augmentation(0, 0, pad=0, flip=False)(x, 0, 0)), x_host)
    flipped = host(Augmentation(0, 0, pad=0)(x, 0, 0))
    assert all(np.array_equal(f, i) or np.array_equal(f, i[:, :, ::-1])
               for f, i in zip(flipped, x_host))
    with pytest.raises(HpcoptError, match="padding"):
        Augmentation(0, 0, pad=-1)
    with pytest.raises(ValueError, match="NCHW"):
        Augmentation(0, 0)(x[0], 0, 0)


def test_oracle_augments_each_batch_with_the_samplers_epoch_and_position(xp):
    model = plain_cnn(2, (5, 4), 3, channels=(2,), hidden=3)
    params = xp.zeros(model.layout.size)
    model.init(params, np.random.default_rng(0))
    x, labels = xp.asarray(images(n=8)), xp.arange(8) % 3
    seen = []

    def augment(batch, epoch, index):
        seen.append((epoch, index))
        return batch * 0

    sampler = MinibatchSampler(np.arange(8), 4, seed=0, rank=0)
    backend = get_backend("cpu" if xp is np else "gpu")
    problem = ClassificationProblem(model, x, labels, sampler, backend, augment=augment)
    for _ in range(3):
        loss = problem.oracle(params, xp.zeros_like(params))
    assert seen == [(0, 0), (0, 1), (1, 0)]
    assert float(loss) == pytest.approx(np.log(3))  # all-zero inputs and zero biases
