"""Isolated egress for the docker backend: a networked container reaches no service of the host.

A container on the engine's bridge network has a network namespace of its own, so its 127.0.0.1
is its own; but the host answers it on every host address (the bridge gateway, eth0: whatever the
host binds on 0.0.0.0), and on machines behind user-mode networking the host's gateway alias
10.0.2.2 leads to the host's loopback (on these machines PostgreSQL and Redis answer there).
`isolate_bridge` puts REJECT rules in the host's firewall before any networked container starts:
from the bridge's subnets, nothing addressed to a host address (INPUT), to the host's default
gateways, to 10.0.2.2 or to link-local 169.254.0.0/16 (cloud metadata) is accepted or forwarded;
the rest of the internet stays reachable. The rules go into CNI's admin chain as well (CNI puts
its own accept rules ahead of the plain FORWARD chain's later ones). Only an engine on this
machine's unix socket can be guarded so; without iptables (or its permission) a networked session
is refused, never opened onto the host's services.

The rules are checked (`iptables -C`, a few ms) before every networked container, not once per
process: rules that were lost since (another process reset them, CNI re-created its chains) are
put back. CNI-ADMIN is created here when CNI is configured and the chain is still missing (before
the first container on a fresh host, CNI has not made it yet; its firewall plugin adopts an
existing chain): rules skipped for want of the chain let that first host's containers through
CNI-FORWARD's accept rules. The bridge's gateway address is rejected even before the bridge
interface exists (it is not yet a host address then).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from thundersync.sandbox import netns
from thundersync.sandbox.executor import SandboxError

HOST_ALIASES = ("10.0.2.2/32", "169.254.0.0/16")
CNI_CONFIG_DIR = Path("/etc/cni/net.d")
_LOCK = threading.Lock()
NO_FIREWALL = (
    "network access was asked for (SessionSpec.network: a Harbor task's [environment] "
    "allow_internet = true) on the docker backend, but {why}; without those rules a container "
    "could reach the host's services (PostgreSQL, Redis). Fix: run as root with iptables "
    "installed (apt install iptables), or set allow_internet = false in the task"
)


def _bridge_configs(client: Any) -> list[dict[str, Any]]:
    """IPv4 IPAM configs of the engine's default bridge network (podman: `podman`, docker:
    `bridge`)."""
    for name in ("podman", "bridge"):
        try:
            net = client.networks.get(name)
        except Exception:  # noqa: BLE001  (not this engine's default network)
            continue
        configs = (net.attrs.get("IPAM") or {}).get("Config") or []
        v4 = [c for c in configs if c.get("Subnet") and ":" not in c["Subnet"]]
        if v4:
            return v4
    raise SandboxError(NO_FIREWALL.format(why="the engine's bridge network has no IPv4 subnet"))


def bridge_subnets(client: Any) -> list[str]:
    return [c["Subnet"] for c in _bridge_configs(client)]


def bridge_gateways(client: Any) -> list[str]:
    """The bridge's gateway addresses (the host's side of the bridge)."""
    return [c["Gateway"] for c in _bridge_configs(client) if c.get("Gateway")]


def host_gateways() -> list[str]:
    out = subprocess.run(["ip", "-4", "route", "show", "default"], capture_output=True, text=True)
    words = out.stdout.split()
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "via"]


def rules(subnets: list[str], gateways: list[str] | None = None) -> list[list[str]]:
    """The iptables rule specs (chain first) that keep `subnets` off the host."""
    out = []
    for src in subnets:
        for addr in dict.fromkeys([*netns.host_addresses(), *(gateways or [])]):
            out.append(["INPUT", "-s", src, "-d", addr, "-j", "REJECT"])
        for dst in (*host_gateways(), *HOST_ALIASES):
            for chain in ("FORWARD", "CNI-ADMIN"):
                out.append([chain, "-s", src, "-d", dst, "-j", "REJECT"])
    return out


def isolate_bridge(client: Any) -> None:
    """Install whatever rules are missing (idempotent: `-C` before `-I`)."""
    base = str(getattr(getattr(client, "api", None), "base_url", ""))
    if base != "http+docker://localhost":  # the SDK's name for a unix socket (ssh: +docker://ssh)
        raise SandboxError(NO_FIREWALL.format(why=f"the engine at {base!r} is not on this machine"))
    iptables = shutil.which("iptables")
    if iptables is None:
        raise SandboxError(NO_FIREWALL.format(why="iptables is not installed"))
    subnets, gateways = bridge_subnets(client), bridge_gateways(client)
    with _LOCK:
        chains = _rules_text(iptables)
        if "-N CNI-ADMIN" not in chains and _cni_configured():
            made = subprocess.run([iptables, "-N", "CNI-ADMIN"], capture_output=True)
            if made.returncode != 0 and "-N CNI-ADMIN" not in _rules_text(iptables):
                raise SandboxError(
                    NO_FIREWALL.format(
                        why=f"`iptables -N CNI-ADMIN` failed: {made.stderr.decode().strip()}"
                    )
                )
            chains += "\n-N CNI-ADMIN"  # (made here, or by another process meanwhile)
        for spec in rules(subnets, gateways):
            if spec[0] == "CNI-ADMIN" and "-N CNI-ADMIN" not in chains:
                continue  # no CNI on this host: the plain FORWARD rules apply
            if subprocess.run([iptables, "-C", *spec], capture_output=True).returncode == 0:
                continue
            _run([iptables, "-I", spec[0], "1", *spec[1:]], "-I " + " ".join(spec))


def _rules_text(iptables: str) -> str:
    return subprocess.run([iptables, "-S"], capture_output=True, text=True).stdout


def _cni_configured() -> bool:
    return CNI_CONFIG_DIR.is_dir() and any(CNI_CONFIG_DIR.glob("*.conflist"))


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        why = f"`iptables {what}` failed: {r.stderr.decode().strip()}"
        raise SandboxError(NO_FIREWALL.format(why=why))
