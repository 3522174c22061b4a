"""A networked local sandbox (`allow_internet`) never reaches the host's loopback services."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from thundersync.sandbox import netns
from thundersync.sandbox.executor import SandboxError, SessionSpec
from thundersync.sandbox.local import LocalExecutor


def _answers(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP service of this test on every host address (0.0.0.0) at a free port."""
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))
    srv.listen()
    yield srv.getsockname()[1]
    srv.close()


PROBE = """for a in "$@"; do
  if timeout 3 bash -c "exec 3<>/dev/tcp/${a%:*}/${a##*:}" 2>/dev/null; then echo "$a open"
  else echo "$a closed"; fi
done"""


def _probe(s: object, targets: list[str]) -> dict[str, str]:
    args = " ".join(targets)
    r = s.exec(f"set -- {args}\n{PROBE}", timeout=60)  # type: ignore[attr-defined]
    return dict(line.split() for line in r.stdout.splitlines())


def test_networked_sandbox_cannot_reach_host_loopback_services(
    local_executor: LocalExecutor, listener: int
) -> None:
    services = [p for p in (5432, 6379) if _answers(p)]  # PostgreSQL, Redis on this machine
    assert _answers(listener)  # the host itself reaches our listener
    hosts = ["127.0.0.1", "10.0.2.2", *netns.host_addresses()]
    targets = [f"{h}:{p}" for h in hosts for p in (5432, 6379, listener)]
    with local_executor.open(SessionSpec(network=True, label="net")) as s:
        seen = _probe(s, targets)
        assert seen == {t: "closed" for t in targets}, (services, seen)
        # the sandbox's 127.0.0.1 is its own loopback: a server started inside answers inside
        own = s.exec(
            "python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1; "
            "timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/8765' && echo own-loopback-ok",
            timeout=30,
        )
        assert "own-loopback-ok" in own.stdout, own
        assert s.exec("cat /etc/resolv.conf").stdout == netns.RESOLV_CONF
        route = s.exec("ip route 2>/dev/null || cat /proc/net/route").stdout
        assert "tap0" in route  # egress through slirp4netns, not the host's interfaces
        assert s.exec("ip route del default 2>&1 || echo denied").stdout.strip().endswith("denied")
    assert services, "PostgreSQL / Redis should answer on the host (scripts/setup.d/10-services.sh)"


def test_offline_sandbox_has_no_route_at_all(local_executor: LocalExecutor) -> None:
    with local_executor.open(SessionSpec(label="offline")) as s:
        assert _probe(s, ["127.0.0.1:5432", "10.0.2.2:5432"]) == {
            "127.0.0.1:5432": "closed",
            "10.0.2.2:5432": "closed",
        }
        assert "tap0" not in s.exec("cat /proc/net/route").stdout


def test_network_without_slirp4netns_is_refused_naming_the_field(
    local_executor: LocalExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netns.shutil, "which", lambda name: None)
    with pytest.raises(SandboxError, match=r"allow_internet.*slirp4netns"):
        local_executor.open(SessionSpec(network=True))


def test_networked_docker_sandbox_cannot_reach_host_services(listener: int) -> None:
    """The docker backend's bridge: no host address (the bridge gateway, eth0), no host gateway
    and not 10.0.2.2 (where this machine's PostgreSQL and Redis answer the host) let a
    networked container in (`sandbox.bridge_net`)."""
    import subprocess

    from thundersync.sandbox import bridge_net
    from thundersync.sandbox.bridge_net import host_gateways
    from thundersync.sandbox.docker_backend import DockerExecutor

    ex = DockerExecutor()
    # start from a host without the rules (an earlier run left them): the session must add them
    gateways = bridge_net.bridge_gateways(ex.client)
    # start from a fresh host's firewall: none of our rules, and none of CNI's chains (CNI makes
    # them at the first networked container; rules skipped for want of CNI-ADMIN let that first
    # container reach 10.0.2.2 through CNI-FORWARD's accept rules). The podman tests run one at
    # a time (tests/conftest.py), so no other networked container is using CNI's chains now.
    for spec in bridge_net.rules(bridge_net.bridge_subnets(ex.client), gateways):
        while subprocess.run(["iptables", "-D", *spec], capture_output=True).returncode == 0:
            pass
    cni_jump = ["FORWARD", "-m", "comment", "--comment", "CNI firewall plugin rules"]
    while subprocess.run(["iptables", "-D", *cni_jump, "-j", "CNI-FORWARD"]).returncode == 0:
        pass
    for chain in ("CNI-FORWARD", "CNI-ADMIN"):
        subprocess.run(["iptables", "-F", chain], capture_output=True)
        subprocess.run(["iptables", "-X", chain], capture_output=True)
    hosts = ["127.0.0.1", "10.0.2.2", *gateways, *netns.host_addresses(), *host_gateways()]
    targets = [f"{h}:{p}" for h in dict.fromkeys(hosts) for p in (5432, 6379, listener)]
    with ex.open(SessionSpec(network=True, label="net-docker")) as s:
        seen = _probe(s, targets)
    assert seen == {t: "closed" for t in targets}, seen
    assert _answers(listener)  # the host itself reaches it
