"""Ranks as processes (``Communicator.from_env`` with the torchrun variables)."""

from conftest import launch


def test_collectives_as_processes():
    runs = launch(3, "collectives", 1000)
    for r, p in enumerate(runs):
        assert p.returncode == 0 and "#wrong=0" in p.stdout, f"rank {r}: {p.stdout}{p.stderr}"


def test_a_killed_peer_raises_peer_lost_on_the_survivors():
    runs = launch(3, "peer_killed", 2, env={"SYMCOMM_PEER_TIMEOUT": "2s"})
    assert runs[2].returncode == -9
    for r in (0, 1):
        p = runs[r]
        assert p.returncode == 0 and "PeerLost" in p.stdout, f"rank {r}: {p.stdout}{p.stderr}"
