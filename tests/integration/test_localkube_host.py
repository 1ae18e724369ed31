"""`make cluster-down` removes the firewall chains the kubelet and the CNI bridge plugin leave
behind, including rules whose comments hold quotes and spaces, and nothing else. Runs against
the host's real iptables with chains of a name no one else uses."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import pytest

from localkube.host import drop_chains


def iptables(*args: str) -> str:
    return subprocess.run(["iptables", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def prefix() -> Iterator[str]:
    prefix = f"GRT{secrets.token_hex(3).upper()}-"
    yield prefix
    drop_chains("iptables", (prefix,))  # whatever a failed test left


def test_chains_and_the_rules_that_jump_to_them_go(prefix: str) -> None:
    firewall, masquerade = f"{prefix}FIREWALL", f"{prefix}0123456789abcdef"
    keep = ["OUTPUT", "-d", "192.0.2.250/32", "-m", "comment", "--comment", f"{prefix}keep"]
    iptables("-N", firewall)
    iptables("-A", firewall, "-d", "192.0.2.251/32", "-j", "DROP")
    iptables("-A", "OUTPUT", "-j", firewall)
    iptables("-t", "nat", "-N", masquerade)
    iptables("-t", "nat", "-A", masquerade, "-j", "MASQUERADE")
    comment = f'name: "gregor-local" id: "{prefix}c0ffee"'
    iptables("-t", "nat", "-A", "POSTROUTING", "-s", "10.244.0.250/32", "-m", "comment",
             "--comment", comment, "-j", masquerade)  # fmt: skip
    iptables("-A", *keep, "-j", "ACCEPT")
    try:
        drop_chains("iptables", (prefix,))
        assert prefix not in iptables("-S").replace(f"{prefix}keep", "")
        assert prefix not in iptables("-t", "nat", "-S")
        assert f"{prefix}keep" in iptables("-S", "OUTPUT")
    finally:
        subprocess.run(["iptables", "-D", *keep, "-j", "ACCEPT"], check=False)
