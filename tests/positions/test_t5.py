"""positions/t5.py: the buckets against the reference formula, the bias a function of m − n."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from poslab.errors import ConfigError
from poslab.positions.t5 import T5Bias, t5_bucket


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 500)])
def test_t5_bucket_properties(num_buckets, max_distance):
    distance = torch.arange(0, 1001)
    buckets = t5_bucket(distance, num_buckets, max_distance)
    assert buckets.dtype == torch.long
    assert buckets.shape == distance.shape
    assert (buckets[1:] >= buckets[:-1]).all(), "bucket must be monotone in distance"
    exact = num_buckets // 2
    assert torch.equal(buckets[:exact], distance[:exact])
    assert buckets.min() >= 0
    assert buckets.max() <= num_buckets - 1
    assert (buckets[max_distance:] == num_buckets - 1).all()
    # the logarithmic range actually uses several buckets between exact and the last one
    assert len(set(buckets[exact:max_distance].tolist())) > 2
    # future keys (negative distance) all map to bucket 0
    assert (t5_bucket(-torch.arange(1, 300), num_buckets, max_distance) == 0).all()


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 500)])
def test_t5_bucket_matches_reference_formula(num_buckets, max_distance):
    # the unidirectional bucketing of the T5 reference implementation, in float64
    def reference(d: int) -> int:
        d = max(d, 0)
        max_exact = num_buckets // 2
        if d < max_exact:
            return d
        ratio = math.log(d / max_exact) / math.log(max_distance / max_exact)
        return min(max_exact + int(ratio * (num_buckets - max_exact)), num_buckets - 1)

    distances = list(range(-5, 1001))
    buckets = t5_bucket(torch.tensor(distances), num_buckets, max_distance)
    assert buckets.tolist() == [reference(d) for d in distances]


@pytest.mark.parametrize("max_distance", [16, 8])
def test_t5_max_distance_within_exact_buckets_is_rejected(max_distance):
    # log(max_distance / (num_buckets/2)) <= 0 would give NaN or decreasing bucket indices
    with pytest.raises(ConfigError, match="max_distance"):
        T5Bias(32, 4, num_buckets=32, max_distance=max_distance)


def test_t5_attention_bias_is_function_of_relative_position():
    torch.manual_seed(7)
    scheme = T5Bias(32, 4)
    nn.init.normal_(scheme.bias)
    q_pos = torch.arange(6) + 3
    k_pos = torch.arange(9)
    bias = scheme.attention_bias(q_pos, k_pos)
    assert bias.shape == (4, 6, 9)
    assert bias.dtype == torch.float32
    by_distance: dict[int, torch.Tensor] = {}
    for i, q in enumerate(q_pos.tolist()):
        for j, k in enumerate(k_pos.tolist()):
            d = q - k
            if d in by_distance:
                assert torch.equal(bias[:, i, j], by_distance[d])
            else:
                by_distance[d] = bias[:, i, j]
    # distinct small distances really get distinct biases
    assert not torch.equal(by_distance[0], by_distance[1])
    # shifting both positions leaves the bias unchanged
    shifted = scheme.attention_bias(q_pos + 1000, k_pos + 1000)
    assert torch.equal(shifted, bias)
    # and it is the table entry of that distance's bucket
    for d, value in by_distance.items():
        bucket = int(t5_bucket(torch.tensor(d)))
        assert torch.equal(value, scheme.bias[0][bucket].detach())


@pytest.mark.parametrize(
    ("train_length", "expected"), [(512, 128), (128, 32), (64, 17), (2048, 512)]
)
def test_t5_auto_max_distance_is_a_quarter_of_the_training_length(train_length, expected):
    scheme = T5Bias(32, 4, max_distance="auto", train_length=train_length)
    assert scheme.max_distance == expected  # the paper's 128 at L = 512; ≥ 17 with 32 buckets


def test_t5_auto_max_distance_without_a_training_length_is_one_line():
    with pytest.raises(ConfigError, match="max_distance=auto needs pos.train_length"):
        T5Bias(32, 4, max_distance="auto")
    with pytest.raises(ConfigError, match="pos.max_distance"):
        T5Bias(32, 4, max_distance="far", train_length=128)
