"""host.network: this host's interfaces and addresses."""

from __future__ import annotations

from dancegrpo_npu.host import network


def test_this_hosts_interfaces_and_addresses_are_found():
    host = network.this_host()
    assert "lo" in host.interfaces and "127.0.0.1" in host.addresses
