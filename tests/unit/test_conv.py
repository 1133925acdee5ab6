"""Convolution, pooling, batch norm and residual blocks against finite differences (float64), and
the ResNet against a direct, loop-based reference, on NumPy and CuPy. The references run on host
copies."""

import numpy as np
import pytest

from hpcopt.backend import array_module
from hpcopt.nn import (
    AvgPool2d,
    BatchNorm,
    Conv2d,
    Flatten,
    GlobalAvgPool2d,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
    plain_cnn,
    resnet,
    softmax_cross_entropy,
)
from hpcopt.nn.models import basic_block
from tests.conftest import host
from tests.gradcheck import numeric_grad


def build(model, rng, xp, jitter=0.1):
    """Flat float64 params (initialized, then jittered so BN gamma/beta are generic), grads and
    buffers of ``xp``, all bound."""
    params, grads = xp.zeros(model.layout.size), xp.zeros(model.layout.size)
    buffers = xp.zeros(model.buffer_layout.size)
    model.init(params, rng)
    params += xp.asarray(jitter * rng.standard_normal(params.size))
    model.init_buffers(buffers)
    model.bind(params, grads)
    model.bind_buffers(buffers)
    return params, grads, buffers


def check_gradients(model, x, rng, train=True, rtol=1e-5, atol=1e-8):
    """Backward of sum(y * R) against central differences, for every parameter and the input
    (on ``x``'s array module)."""
    xp = array_module(x)
    params, grads, buffers = build(model, rng, xp)
    weights = xp.asarray(rng.standard_normal(model.forward(x, train).shape))
    dy = weights.copy()
    dx = model.backward(dy, need_input_grad=True)
    np.testing.assert_array_equal(host(dy), host(weights))  # backward never writes into dy
    saved = host(buffers)

    def f():
        return float((model.forward(x, train) * weights).sum())

    np.testing.assert_allclose(host(grads), numeric_grad(f, params), rtol=rtol, atol=atol)
    np.testing.assert_allclose(host(dx), numeric_grad(f, x), rtol=rtol, atol=atol)
    if not train:
        np.testing.assert_array_equal(host(buffers), saved)  # evaluation only reads the statistics
    return params, buffers


# -- direct references: one output position (or channel) at a time -----------------------------

def ref_conv(x, w, b, stride, pad):
    n, c, h, wd = x.shape
    o, _, k, _ = w.shape
    padded = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    padded[:, :, pad:pad + h, pad:pad + wd] = x
    ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    out = np.zeros((n, o, ho, wo))
    for u in range(ho):
        for v in range(wo):
            patch = padded[:, :, u * stride:u * stride + k, v * stride:v * stride + k]
            out[:, :, u, v] = np.einsum("nckl,ockl->no", patch, w)
    return out if b is None else out + b[None, :, None, None]


def ref_pool(x, k, stride, reduce):
    n, c, h, w = x.shape
    ho, wo = (h - k) // stride + 1, (w - k) // stride + 1
    out = np.zeros((n, c, ho, wo))
    for u in range(ho):
        for v in range(wo):
            out[:, :, u, v] = reduce(x[:, :, u * stride:u * stride + k, v * stride:v * stride + k],
                                     axis=(2, 3))
    return out


def ref_bn(x, gamma, beta, mean, var, eps=1e-5):
    out = np.empty_like(x)
    for ch in range(x.shape[1]):
        out[:, ch] = (x[:, ch] - mean[ch]) / np.sqrt(var[ch] + eps) * gamma[ch] + beta[ch]
    return out


def ref_shortcut(x, out_channels, stride):
    n, c = x.shape[:2]
    kept = x[:, :, ::stride, ::stride]
    out = np.zeros((n, out_channels, *kept.shape[2:]))
    before = (out_channels - c) // 2
    for ch in range(c):
        out[:, before + ch] = kept[:, ch]
    return out


def ref_resnet(p, buffers, x, depth, width, train):
    """The CIFAR ResNet written out by hand from the paper, reading parameters by name."""
    def bn(name, z):
        if train:
            mean, var = z.mean(axis=(0, 2, 3)), z.var(axis=(0, 2, 3))
            m = z.size // z.shape[1]
            buffers[f"{name}.running_mean"] = 0.1 * mean
            buffers[f"{name}.running_var"] = 0.9 + 0.1 * var * m / (m - 1)
        else:
            mean, var = buffers[f"{name}.running_mean"], buffers[f"{name}.running_var"]
        return ref_bn(z, p[f"{name}.weight"], p[f"{name}.bias"], mean, var)

    relu = lambda z: np.maximum(z, 0)  # noqa: E731
    h = relu(bn("bn1", ref_conv(x, p["conv1.weight"], None, 1, 1)))
    n = (depth - 2) // 6
    index = 0
    for stage, channels in enumerate((width, 2 * width, 4 * width)):
        for block in range(n):
            index += 1
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"block{index}"
            y = relu(bn(f"{name}.bn1", ref_conv(h, p[f"{name}.conv1.weight"], None, stride, 1)))
            y = bn(f"{name}.bn2", ref_conv(y, p[f"{name}.conv2.weight"], None, 1, 1))
            same_shape = h.shape[1] == channels and stride == 1
            skip = h if same_shape else ref_shortcut(h, channels, stride)
            h = relu(y + skip)
    return h.mean(axis=(2, 3)) @ p["fc.weight"] + p["fc.bias"]


# -- convolution -----------------------------------------------------------------------------

@pytest.mark.parametrize("kernel,stride,padding,bias", [
    (3, 1, 1, True), (3, 2, 1, False), (2, 2, 0, True), (3, 2, 2, True), (1, 1, 0, False),
])
def test_conv_matches_direct_loop_and_finite_differences(kernel, stride, padding, bias, xp):
    rng = np.random.default_rng(0)
    model = Sequential([Conv2d(3, 4, kernel, stride, padding, bias=bias, name="c")])
    x = xp.asarray(rng.standard_normal((2, 3, 7, 6)))
    params, _ = check_gradients(model, x, rng)
    views = model.layout.views(host(params))
    expected = ref_conv(host(x), views["c.weight"], views.get("c.bias"), stride, padding)
    np.testing.assert_allclose(host(model.forward(x)), expected, rtol=1e-12, atol=1e-12)


def test_conv_keeps_dtype_and_reuses_its_workspace(xp):
    rng = np.random.default_rng(1)
    model = Sequential([Conv2d(2, 3, 3, 1, 1, name="c")])
    params = xp.zeros(model.layout.size, np.float32)
    model.init(params, rng)
    model.bind(params, xp.zeros_like(params))
    x = xp.asarray(rng.standard_normal((4, 2, 5, 5)).astype(np.float32))
    y = model.forward(x)
    cols = model.layers[0]._cols
    assert y.dtype == np.float32 and y.flags.c_contiguous
    model.backward(xp.ones_like(y))
    model.forward(x + 1)
    assert xp.shares_memory(model.layers[0]._cols, cols)  # same scratch array, no new allocation


def test_conv_rejects_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="positive"):
        Conv2d(0, 3, 3)
    with pytest.raises(ValueError, match="padding"):
        Conv2d(1, 3, 3, padding=-1)
    model = Sequential([Conv2d(2, 3, 5, name="c")])
    params = np.zeros(model.layout.size)
    model.bind(params, params.copy())
    with pytest.raises(ValueError, match=r"\(N, 2, H, W\)"):
        model.forward(np.zeros((1, 3, 8, 8)))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        model.forward(np.zeros((1, 2, 4, 8)))


# -- pooling -----------------------------------------------------------------------------------

@pytest.mark.parametrize("layer,reference", [
    (MaxPool2d(2), lambda x: ref_pool(x, 2, 2, np.max)),
    (MaxPool2d(3, stride=2), lambda x: ref_pool(x, 3, 2, np.max)),  # overlapping windows
    (AvgPool2d(2), lambda x: ref_pool(x, 2, 2, np.mean)),
    (AvgPool2d(3, stride=2), lambda x: ref_pool(x, 3, 2, np.mean)),
    (GlobalAvgPool2d(), lambda x: x.mean(axis=(2, 3))),
    (Flatten(), lambda x: x.reshape(x.shape[0], -1)),
])
def test_pooling_matches_direct_loop_and_finite_differences(layer, reference, xp):
    rng = np.random.default_rng(2)
    model = Sequential([layer])
    x = xp.asarray(rng.standard_normal((2, 3, 7, 6)))
    check_gradients(model, x, rng)
    np.testing.assert_allclose(host(model.forward(x)), reference(host(x)), rtol=1e-12, atol=1e-12)


def test_max_pool_sends_the_gradient_to_one_maximum_per_window(xp):
    pool = MaxPool2d(2)
    x = xp.zeros((1, 1, 2, 4))
    x[0, 0, 1, 3] = 1.0  # second window has a unique maximum; the first is a tie of zeros
    pool.forward(x)
    dx = host(pool.backward(xp.ones((1, 1, 1, 2))))
    assert dx.sum() == 2 and dx[0, 0, 1, 3] == 1 and dx[0, 0, 0, 0] == 1


# -- batch normalization ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3, 3, 2), (6, 3)])
def test_batchnorm_training_gradients_and_running_statistics(shape, xp):
    rng = np.random.default_rng(3)
    model = Sequential([BatchNorm(3, momentum=0.25, name="bn")])
    x_host = 2 + 3 * rng.standard_normal(shape)
    x = xp.asarray(x_host)
    params, buffers = check_gradients(model, x, rng)
    axes = (0, *range(2, x.ndim))
    buffers.fill(0.5)
    y = model.forward(x, train=True)
    views, stats = model.layout.views(host(params)), model.buffer_layout.views(host(buffers))
    mean, var = x_host.mean(axis=axes), x_host.var(axis=axes)
    expected = ref_bn(x_host, views["bn.weight"], views["bn.bias"], mean, var)
    np.testing.assert_allclose(host(y), expected, rtol=1e-12, atol=1e-12)
    m = x.size // 3
    np.testing.assert_allclose(stats["bn.running_mean"], 0.75 * 0.5 + 0.25 * mean, rtol=1e-12)
    np.testing.assert_allclose(stats["bn.running_var"], 0.75 * 0.5 + 0.25 * var * m / (m - 1),
                               rtol=1e-12)


def test_batchnorm_evaluation_uses_running_statistics_only(xp):
    rng = np.random.default_rng(4)
    model = Sequential([BatchNorm(3, name="bn")])
    params, grads, buffers = build(model, rng, xp)
    stats = model.buffer_layout.views(buffers)
    stats["bn.running_mean"][:] = xp.asarray([0.5, -1.0, 2.0])
    stats["bn.running_var"][:] = xp.asarray([0.3, 2.0, 1.5])
    x_host = rng.standard_normal((2, 3, 4, 4))
    x = xp.asarray(x_host)
    views, set_stats = model.layout.views(host(params)), model.buffer_layout.views(host(buffers))
    expected = ref_bn(x_host, views["bn.weight"], views["bn.bias"], set_stats["bn.running_mean"],
                      set_stats["bn.running_var"])
    np.testing.assert_allclose(host(model.forward(x, train=False)), expected, rtol=1e-12)
    np.testing.assert_allclose(host(model.forward(x[:1], train=False)), expected[:1], rtol=1e-12)
    weights = xp.asarray(rng.standard_normal(x.shape))
    model.forward(x, train=False)
    dx = model.backward(weights, need_input_grad=True)
    f = lambda: float((model.forward(x, train=False) * weights).sum())  # noqa: E731
    np.testing.assert_allclose(host(grads), numeric_grad(f, params), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(host(dx), numeric_grad(f, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(host(stats["bn.running_mean"]), [0.5, -1.0, 2.0])


def test_batchnorm_needs_bound_buffers_and_two_values_per_channel():
    model = Sequential([BatchNorm(2, name="bn")])
    params = np.zeros(model.layout.size)
    model.bind(params, params.copy())
    with pytest.raises(RuntimeError, match="bind_buffers"):
        model.forward(np.zeros((4, 2)))
    model.bind_buffers(np.zeros(model.buffer_layout.size))
    with pytest.raises(ValueError, match="more than one value"):
        model.forward(np.zeros((1, 2)))


# -- residual blocks and models -------------------------------------------------------------

@pytest.mark.parametrize("in_channels,out_channels,stride", [(3, 3, 1), (2, 4, 2), (3, 5, 1)])
def test_residual_block_gradients(in_channels, out_channels, stride, xp):
    rng = np.random.default_rng(5)
    model = Sequential([basic_block(in_channels, out_channels, stride, "block1"), ReLU()])
    assert model.layout.names == [f"block1.{n}" for n in
                                  ("conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight",
                                   "bn2.weight", "bn2.bias")]
    assert model.buffer_layout.names == [f"block1.bn{i}.running_{s}" for i in (1, 2)
                                         for s in ("mean", "var")]
    x = xp.asarray(rng.standard_normal((3, in_channels, 5, 5)))
    check_gradients(model, x, rng)
    check_gradients(model, x, rng, train=False)


@pytest.mark.parametrize("train", [True, False])
def test_resnet_matches_loop_reference(train, xp):
    rng = np.random.default_rng(6)
    model = resnet(8, in_channels=3, num_classes=5, width=4)
    params, _, buffers = build(model, rng, xp)
    buffers += xp.asarray(0.5 * rng.random(buffers.size))  # non-trivial statistics for evaluation
    expected_stats = dict(model.buffer_layout.views(host(buffers)))
    x = xp.asarray(rng.standard_normal((3, 3, 8, 8)))
    out = model.forward(x, train)
    views = model.layout.views(host(params))
    expected = ref_resnet(views, expected_stats, host(x), depth=8, width=4, train=train)
    np.testing.assert_allclose(host(out), expected, rtol=1e-10, atol=1e-12)
    if not train:  # evaluation only reads the running statistics
        for name, value in model.buffer_layout.views(host(buffers)).items():
            np.testing.assert_array_equal(value, expected_stats[name])


def test_resnet_running_statistics_follow_the_reference(xp):
    rng = np.random.default_rng(7)
    model = resnet(8, in_channels=2, num_classes=3, width=2)
    params, _, buffers = build(model, rng, xp)
    x = xp.asarray(rng.standard_normal((4, 2, 6, 6)))
    model.forward(x, train=True)
    expected = {}
    ref_resnet(model.layout.views(host(params)), expected, host(x), depth=8, width=2, train=True)
    for name, value in model.buffer_layout.views(host(buffers)).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-10, atol=1e-12, err_msg=name)


def test_resnet_gradient_matches_directional_finite_differences(xp):
    rng = np.random.default_rng(8)
    model = resnet(8, in_channels=2, num_classes=3, width=2)
    params, grads, _ = build(model, rng, xp)
    x, labels = xp.asarray(rng.standard_normal((4, 2, 6, 6))), xp.asarray(rng.integers(0, 3, 4))
    _, dlogits = softmax_cross_entropy(model.forward(x), labels)
    model.backward(dlogits)
    f = lambda: float(softmax_cross_entropy(model.forward(x), labels)[0])  # noqa: E731
    for _ in range(4):
        direction = xp.asarray(rng.standard_normal(params.size))
        params += 1e-6 * direction
        up = f()
        params -= 2e-6 * direction
        down = f()
        params += 1e-6 * direction
        assert (up - down) / 2e-6 == pytest.approx(float(grads @ direction), rel=1e-5, abs=1e-9)


def test_resnet_sizes_and_names():
    model = resnet(20)
    assert model.layout.size == 269_722  # ResNet-20 of the paper: 0.27 M parameters
    assert model.buffer_layout.size == 2 * (16 + 6 * (16 + 32 + 64))  # 19 BN layers
    assert model.layout.names[:4] == ["conv1.weight", "bn1.weight", "bn1.bias",
                                      "block1.conv1.weight"]
    assert model.layout.names[-2:] == ["fc.weight", "fc.bias"]
    assert "block9.bn2.running_var" in model.buffer_layout.names
    assert resnet(14).layout.size < resnet(20).layout.size
    for depth in (7, 9, 2):
        with pytest.raises(ValueError, match="6n"):
            resnet(depth)


def test_plain_cnn_gradients_and_shapes(xp):
    rng = np.random.default_rng(9)
    model = plain_cnn(1, (8, 8), 3, channels=(2, 3), hidden=5, batch_norm=True)
    assert [n for n in model.layout.names if n.startswith("conv")] == ["conv1.weight",
                                                                       "conv2.weight"]
    assert model.buffer_layout.names[0] == "bn1.running_mean"
    check_gradients(model, xp.asarray(rng.standard_normal((3, 1, 8, 8))), rng)
    plain = plain_cnn(3, (9, 7), 10)
    assert plain.buffer_layout.size == 0
    assert isinstance(plain.layers[-1], Linear) and plain.layers[-1].fan_in == 128
    assert plain.layers[-3].fan_in == 64 * 2 * 1
    with pytest.raises(ValueError, match="too small"):
        plain_cnn(1, (8, 8), 3, channels=(2, 2, 2, 2))
