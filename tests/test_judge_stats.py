"""Bootstrap intervals of win / tie / lose, and agreement between judges, on hand-checkable cases."""

import math

import pytest

from rlhf_core.judge.stats import agreement, bootstrap_rates, verdict_metrics


def test_unanimous_verdicts_have_a_zero_width_interval():
    assert bootstrap_rates(["win"] * 7, n_boot=200) == {"win": (1.0, 1.0, 1.0), "tie": (0.0, 0.0, 0.0),
                                                        "lose": (0.0, 0.0, 0.0)}


def test_five_wins_in_ten_give_the_binomial_interval_0_2_to_0_8():
    # A resample's win count is Binomial(10, 1/2): P(<= 1) = 11/1024 = 1.1 % and P(<= 2) = 56/1024 = 5.5 %,
    # so the 2.5 % quantile is 2/10; by symmetry the 97.5 % quantile is 8/10.
    rates = bootstrap_rates(["win"] * 5 + ["lose"] * 5, n_boot=20_000, seed=3)
    assert rates["win"] == (0.5, 0.2, 0.8) and rates["lose"] == (0.5, 0.2, 0.8)
    assert rates["tie"] == (0.0, 0.0, 0.0)


def test_seeded_and_narrower_with_more_prompts():
    verdicts = ["win", "tie", "lose", "win"] * 5
    assert bootstrap_rates(verdicts, seed=1) == bootstrap_rates(verdicts, seed=1)
    small = bootstrap_rates(verdicts, seed=1)["win"]
    large = bootstrap_rates(verdicts * 10, seed=1)["win"]
    assert small[0] == large[0] == 0.5 and (large[2] - large[1]) < (small[2] - small[1])


def test_verdict_metrics_flat_names_and_empty_input():
    m = verdict_metrics(["win", "lose"], n_boot=5000, seed=0)
    # a resample of two holds 0, 1 or 2 wins with probabilities 1/4, 1/2, 1/4: the interval is [0, 1]
    assert (m["n"], m["win_rate"], m["win_rate_lo"], m["win_rate_hi"]) == (2.0, 0.5, 0.0, 1.0)
    assert all(math.isnan(v) for k, v in verdict_metrics([]).items() if k != "n")
    with pytest.raises(ValueError, match="draw"):
        bootstrap_rates(["draw"])


def test_agreement_between_judges():
    assert agreement(["win", "tie", "lose", "win"], ["win", "lose", "lose", "tie"]) == 0.5
    assert agreement(["win", "tie", "lose", "win"], ["win", "tie", "lose", "tie"]) == 0.75  # not 1 - agreement
    assert math.isnan(agreement([], []))
    with pytest.raises(ValueError, match="not the same pairs"):
        agreement(["win"], ["win", "tie"])


def test_the_interval_is_the_levels_and_the_point_is_the_sample_value():
    """A 90 % interval read at the 10 % / 90 % quantiles was reported as 95 % and passed (at 5/10 the 2.5 % and 5 %
    quantiles coincide); the point of a skewed mean is the sample mean, not the bootstrap's median; n counts the
    verdicts, not their kinds."""
    from rlhf_core.judge.stats import bootstrap_mean

    # Binomial(10, 0.5) / 10: P(<= 0.2) = 0.055, P(<= 0.3) = 0.17: the 5 % quantile is 0.2, the 10 % one 0.3
    assert bootstrap_rates(["win"] * 5 + ["lose"] * 5, n_boot=20000, seed=3, level=0.9)["win"] == (0.5, 0.2, 0.8)
    skewed = [0.1, 0.2, 0.3, 0.5, 0.7, 1.1, 1.3, 2.9, 50.3]  # the bootstrap means' median is 6.3 here
    mean, lo, hi = bootstrap_mean([*skewed, float("nan")], n_boot=20000, seed=3, level=0.9)
    assert mean == pytest.approx(57.4 / 9) and lo < mean < hi
    assert verdict_metrics(["win", "win", "lose"])["n"] == 3
