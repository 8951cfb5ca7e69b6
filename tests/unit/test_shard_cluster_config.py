"""The shard count of a cluster: written by `cluster init --shards S` only when S > 1, read as 1 when absent."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import cli
from devtools.dev_spec import DevClusterError, DevClusterSpec
from election import ElectionError
from election.cluster_config import ClusterOptions, cluster_shards, new_config


def test_only_a_cluster_of_several_shards_says_so_in_its_config():
    one = new_config(ClusterOptions(), clock=lambda: 1.0)
    assert "shards" not in one and cluster_shards(one) == 1
    three = new_config(ClusterOptions(), clock=lambda: 1.0, shards=3)
    assert three["shards"] == 3 and cluster_shards(three) == 3


@pytest.mark.parametrize("shards", [0, 65, "3", True, None])
def test_a_shard_count_out_of_range_is_refused(shards):
    with pytest.raises(ElectionError, match="shards must be an integer between 1 and 64"):
        cluster_shards({"shards": shards})
    if shards is not None:
        with pytest.raises(ElectionError):
            new_config(ClusterOptions(), clock=lambda: 1.0, shards=shards)


def test_cluster_init_help_says_what_shards_are_and_that_they_are_fixed():
    result = CliRunner().invoke(cli.main, ["cluster", "init", "--help"])
    text = " ".join(result.output.split())
    assert "--shards" in text and "Fixed for the cluster's life" in text and "cannot be changed" in text
    refused = CliRunner().invoke(cli.main, ["cluster", "init", "--shards", "65", "--zk", "127.0.0.1:1"])
    assert refused.exit_code == 2


def test_broker_start_help_does_not_show_the_shard_option():
    result = CliRunner().invoke(cli.main, ["broker", "start", "--help"])
    assert result.exit_code == 0 and "--shard" not in result.output


def test_dev_up_checks_its_shard_count():
    assert DevClusterSpec(shards=4).validate().shards == 4
    assert DevClusterSpec().validate().shards is None
    with pytest.raises(DevClusterError, match="--shards must be between 1 and 64"):
        DevClusterSpec(shards=0).validate()
