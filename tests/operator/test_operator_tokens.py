"""Job tokens are derived from the operator's key (tokens.py), so the operator never reads a Secret; the operator's
pods for the NetworkPolicy come from the chart's environment (network_policy.py)."""

from __future__ import annotations

import pytest
from ftjob_operator import network_policy, tokens

KEY = b"k" * 32


def test_a_token_is_the_same_for_the_same_job_and_differs_for_any_other():
    token = tokens.derive(KEY, "ns", "job", "uid-1")
    assert token == tokens.derive(KEY, "ns", "job", "uid-1") and len(token) == 64
    others = {
        tokens.derive(KEY, "ns", "job", "uid-2"),  # a new job of the same name
        tokens.derive(KEY, "other", "job", "uid-1"),
        tokens.derive(KEY, "ns", "job2", "uid-1"),
        tokens.derive(b"x" * 32, "ns", "job", "uid-1"),  # another operator's key
    }
    assert token not in others and len(others) == 4
    with pytest.raises(ValueError, match="no uid"):
        tokens.derive(KEY, "ns", "job", "")


def test_the_key_comes_from_the_environment_and_a_short_one_is_refused():
    assert tokens.key_from_env({}) is None and tokens.key_from_env({tokens.TOKEN_KEY_ENV: " "}) is None
    assert tokens.key_from_env({tokens.TOKEN_KEY_ENV: "a" * 48}) == b"a" * 48
    with pytest.raises(tokens.TokenKeyError, match="at least 16"):
        tokens.key_from_env({tokens.TOKEN_KEY_ENV: "short"})


def test_the_operators_pods_come_from_the_charts_environment():
    env = {network_policy.OPERATOR_POD_LABELS_ENV: '{"app": "ftjob"}', "POD_NAMESPACE": "ftjob-system"}
    assert network_policy.operator_pods_from_env(env) == network_policy.OperatorPods(
        "ftjob-system", {"app": "ftjob"}
    )
    assert network_policy.operator_pods_from_env({}) is None
    with pytest.raises(ValueError, match="JSON object"):
        network_policy.operator_pods_from_env({**env, network_policy.OPERATOR_POD_LABELS_ENV: "[1]"})
