import pytest
import torch

from ptcourse.core import numerics, seeds


def test_max_abs_error_of_tensors_and_lists():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])
    assert numerics.max_abs_error(a, b) == pytest.approx(0.5)
    assert numerics.max_abs_error([a, a], [a, b]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        numerics.max_abs_error([a], [a, b])


def test_relative_error_is_a_norm_ratio_over_all_tensors():
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])
    assert numerics.relative_error(a + b, b) == pytest.approx(3 / 4)
    assert numerics.relative_error([a, b], [a, b]) == 0.0
    assert numerics.relative_error([torch.zeros(2), b], [a, b]) == pytest.approx(3 / 5)


def test_seeded_repeats_and_leaves_the_global_rng_alone():
    torch.manual_seed(1)
    expected_next = torch.rand(1)
    torch.manual_seed(1)
    one = seeds.seeded(lambda: torch.nn.Linear(3, 2), 7)
    two = seeds.seeded(lambda: torch.nn.Linear(3, 2), 7)
    assert torch.equal(one.weight, two.weight)
    assert torch.equal(torch.rand(1), expected_next)
    assert torch.equal(
        torch.rand(2, generator=seeds.generator(3)), torch.rand(2, generator=seeds.generator(3))
    )
