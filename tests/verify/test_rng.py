"""Keyed uniforms and inverse-CDF sampling (THEORY §4)."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy import stats

from relaxspec_audit.verify.rng import Purpose, request_key, sample_icdf, uniforms


def test_uniforms_deterministic_and_keyed():
    pos = np.arange(1000)
    a = uniforms(7, 123, pos, Purpose.ACCEPT)
    assert a.dtype == np.float64 and a.shape == (1000,)
    np.testing.assert_array_equal(a, uniforms(7, 123, pos, Purpose.ACCEPT))
    # Position-wise: the value at a position does not depend on which other positions are asked.
    np.testing.assert_array_equal(a[500:510], uniforms(7, 123, np.arange(500, 510), Purpose.ACCEPT))
    for other in (
        uniforms(8, 123, pos, Purpose.ACCEPT),
        uniforms(7, 124, pos, Purpose.ACCEPT),
        uniforms(7, 123, pos, Purpose.SAMPLE),
        uniforms(7, 123, pos + 1, Purpose.ACCEPT),
    ):
        # Unrelated streams: essentially never equal, and uncorrelated.
        assert np.mean(a == other) < 0.01
        assert abs(np.corrcoef(a, other)[0, 1]) < 0.1


def test_uniforms_distribution_is_uniform():
    u = uniforms(0, request_key("r"), np.arange(200_000), Purpose.DRAFT)
    assert u.min() >= 0.0 and u.max() < 1.0
    # KS against U(0,1): a broken mixer (e.g. low bits only) fails by a wide margin.
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    # Lag-1 independence: consecutive positions must not be correlated.
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01


def test_uniforms_2d_and_bad_input():
    pos = np.arange(12).reshape(3, 4)
    assert uniforms(1, 2, pos, Purpose.SAMPLE).shape == (3, 4)
    with pytest.raises(ValueError, match="abs_pos"):
        uniforms(1, 2, np.array([-1]), Purpose.SAMPLE)
    with pytest.raises(TypeError, match="abs_pos"):
        uniforms(1, 2, np.array([0.5]), Purpose.SAMPLE)
    with pytest.raises(TypeError, match="seed"):
        uniforms("x", 2, np.arange(3), Purpose.SAMPLE)


def test_request_key_stable_across_processes():
    k = request_key("gsm8k/0001")
    assert 0 <= k < 2**63
    assert k != request_key("gsm8k/0002")
    # Python's hash() is salted per process; ours must not be.
    code = "from relaxspec_audit.verify.rng import request_key; print(request_key('gsm8k/0001'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == k
    with pytest.raises(TypeError, match="request_id"):
        request_key(5)


def test_sample_icdf_inverse_cdf_and_zero_probability():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    u = torch.tensor([0.0, 0.2499, 0.25, 0.9999, 1.0 - 2**-53])
    got = sample_icdf(probs.expand(5, 5), u)
    # CDF = [0, .25, .25, 1, 1]: first index with cdf > u; zero-probability ids never chosen.
    assert got.tolist() == [1, 1, 3, 3, 3]
    # Rounding past the end clamps to the last positive token (here u * total >= cdf[-1]).
    assert sample_icdf(probs, torch.tensor(1.0)).item() == 3
    # Unnormalised rows are scaled by their total.
    assert sample_icdf(torch.tensor([2.0, 2.0]), torch.tensor(0.6)).item() == 1
    with pytest.raises(ValueError, match="u shape"):
        sample_icdf(probs.expand(2, 5), torch.zeros(3))


def test_sample_icdf_matches_distribution():
    p = torch.tensor([0.1, 0.0, 0.4, 0.3, 0.2])
    u = torch.as_tensor(uniforms(3, 0, np.arange(50_000), Purpose.SAMPLE))
    x = sample_icdf(p.expand(50_000, 5), u).numpy()
    counts = np.bincount(x, minlength=5)
    assert counts[1] == 0
    expected = np.array([0.1, 0.0, 0.4, 0.3, 0.2]) * 50_000
    keep = expected > 0
    assert stats.chisquare(counts[keep], expected[keep]).pvalue > 1e-3
