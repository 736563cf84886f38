"""Ranks as processes (``Communicator.from_env`` with the torchrun variables)."""

from conftest import launch


def test_collectives_as_processes():
    runs = launch(3, "collectives", 1000)
    for r, p in enumerate(runs):
        ok = p.returncode == 0 and "#wrong=0 across one host" in p.stdout
        assert ok, f"rank {r}: {p.stdout}{p.stderr}"


def test_collectives_across_two_hosts():
    # Ranks 0 and 2 on one simulated host, 1 on the other (UCX between them): a window all-reduce
    # and an all-gather of host arrays across hosts.
    runs = launch(3, "collectives", 1000, hosts=["py-a", "py-b", "py-a"])
    for r, p in enumerate(runs):
        ok = p.returncode == 0 and "#wrong=0 across hosts" in p.stdout
        assert ok, f"rank {r}: {p.stdout}{p.stderr}"


def test_a_killed_peer_raises_peer_lost_on_the_survivors():
    runs = launch(3, "peer_killed", 2, env={"SYMCOMM_PEER_TIMEOUT": "2s"})
    assert runs[2].returncode == -9
    for r in (0, 1):
        p = runs[r]
        assert p.returncode == 0 and "PeerLost" in p.stdout, f"rank {r}: {p.stdout}{p.stderr}"
