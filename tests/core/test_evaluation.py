"""Evaluating theta: per-sample cross-entropy and correctness as by hand, in any chunking, whatever the model held."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.data import ClientData
from fedfair.core.evaluation import evaluate
from fedfair.core.models import build_model, flat_parameters

FEATURES = 4


def sample(size: int, classes: int, seed: int) -> tuple[ClientData, torch.Tensor]:
    """`size` float64 Gaussian rows with labels, and a random theta for a logistic regression on them."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(size, FEATURES, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, classes, (size,), generator=generator)
    outputs = 1 if classes == 2 else classes
    theta = torch.randn(outputs * (FEATURES + 1), generator=generator, dtype=torch.float64)
    return ClientData("site", features, labels), theta


def by_hand(data: ClientData, theta: torch.Tensor, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Cross-entropy and correctness from the logits z = W x + b, in numpy: theta is W row by row, then b."""
    outputs = 1 if classes == 2 else classes
    x, y, parameters = data.features.numpy(), data.labels.numpy(), theta.numpy()
    weight, bias = parameters[: outputs * FEATURES].reshape(outputs, FEATURES), parameters[outputs * FEATURES :]
    logits = x @ weight.T + bias
    if classes == 2:  # one logit z: the probability of class 1 is sigmoid(z)
        z = logits[:, 0]
        return np.logaddexp(0.0, np.where(y == 1, -z, z)), (z > 0).astype(int) == y
    top = logits.max(axis=1, keepdims=True)
    log_partition = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    return log_partition - logits[np.arange(len(y)), y], logits.argmax(axis=1) == y


@pytest.mark.parametrize("classes", [2, 3])
def test_losses_and_correctness_are_each_samples_cross_entropy_and_argmax_hit(classes: int) -> None:
    data, theta = sample(50, classes, seed=classes)
    model = build_model("logreg", FEATURES, classes, dtype=torch.float64)
    result = evaluate(model, theta, data)
    losses, correct = by_hand(data, theta, classes)
    assert result.losses.dtype == np.float64 and result.losses.shape == (50,)
    assert result.correct.dtype == np.bool_ and result.correct.shape == (50,)
    # Float64 logits of 4 unit-scale features: both sides agree to a few ulps of losses of order 1.
    np.testing.assert_allclose(result.losses, losses, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(result.correct, correct)
    assert 0 < result.correct.sum() < 50, "a random theta is right on some samples and wrong on others"


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 40), chunk=st.integers(1, 45), seed=st.integers(0, 2**16))
def test_the_chunk_size_never_changes_the_result(size: int, chunk: int, seed: int) -> None:
    data, theta = sample(size, 3, seed)
    model = build_model("logreg", FEATURES, 3, dtype=torch.float64)
    whole, chunked = evaluate(model, theta, data), evaluate(model, theta, data, chunk=chunk)
    # Each row's logits are the same dot products in either chunking; only BLAS blocking may move an ulp.
    np.testing.assert_allclose(chunked.losses, whole.losses, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(chunked.correct, whole.correct)


def test_the_result_depends_on_theta_alone_not_on_the_weights_the_model_held() -> None:
    data, _ = sample(30, 3, seed=7)
    first = build_model("mlp", FEATURES, 3, seed=1, dtype=torch.float64)
    second = build_model("mlp", FEATURES, 3, seed=2, dtype=torch.float64)
    theta = flat_parameters(build_model("mlp", FEATURES, 3, seed=3, dtype=torch.float64))
    a, b = evaluate(first, theta, data), evaluate(second, theta, data)
    np.testing.assert_array_equal(a.losses, b.losses)
    np.testing.assert_array_equal(a.correct, b.correct)


def test_a_float32_model_evaluates_a_float64_theta_in_its_own_precision() -> None:
    data, theta = sample(40, 3, seed=11)
    wide = evaluate(build_model("logreg", FEATURES, 3, dtype=torch.float64), theta, data)
    narrow = evaluate(build_model("logreg", FEATURES, 3, dtype=torch.float32), theta, data)
    assert narrow.losses.dtype == np.float64, "losses come back as float64 whatever the model's dtype"
    # Rounding theta, x and five products per logit to float32 moves a loss by about 10 * 2^-24 times its scale.
    np.testing.assert_allclose(narrow.losses, wide.losses, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(narrow.losses, wide.losses), "the model's precision was used, not theta's"
