"""The checks of a launch's network options, before anything starts.

- A job of several nodes needs ``--master-addr``: without it every node rendezvouses with
  itself (127.0.0.1) and waits out HCCL's connect timeout.
- A node other than the master must be given another host's address: one that is loopback or
  this host's own would again be itself.
- ``--ifname`` must be an interface of this host (HCCL, NCCL and Gloo bind to it).
- The dry run of a job of several nodes plans it for the compute nodes, wherever it runs (a
  login node): what only those nodes can answer (their interfaces, node 0's name in their
  resolver) is not refused there but named as not checked (``not_checked_here``).
- Ports are 1024-65535: below 1024 needs root, and torchrun's store would not bind.

This host's interfaces come from ``socket.if_nameindex()``, its IPv4 addresses from each
interface (the SIOCGIFADDR ioctl) and from its own name; no package beyond the standard library.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from dancegrpo_npu.errors import DancegrpoError

PORT_RANGE = (1024, 65535)
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Host:
    """What the checks need to know about this host."""

    interfaces: tuple[str, ...]
    addresses: frozenset[str]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def interfaces() -> tuple[str, ...]:
    try:
        return tuple(name for _, name in socket.if_nameindex())
    except OSError:
        return ()


def _interface_address(name: str) -> str | None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def this_host() -> Host:
    names = interfaces()
    addresses = {a for a in (_interface_address(n) for n in names) if a}
    for host in {socket.gethostname(), socket.getfqdn()}:
        try:
            addresses |= {info[4][0] for info in socket.getaddrinfo(host, None)}
        except OSError:
            pass
    return Host(names, frozenset(addresses))


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def check_port(option: str, port: int | None) -> None:
    low, high = PORT_RANGE
    if port is not None and not low <= port <= high:
        raise DancegrpoError(
            f"{option} {port} is not a usable port",
            f"use a port in {low}..{high} that is free on the master node (torchrun's default is 29500)",
            exit_code=2,
        )


def _no_such_interface(ifname: str, host: Host) -> str:
    shown = ", ".join(host.interfaces) or "none found"
    return f"--ifname {ifname}: this host has no such network interface (it has: {shown})"


def not_checked_here(nnodes: int, node_rank: int, master_addr: str | None, ifname: str | None, host: Host) -> list[str]:
    """What the dry run of a job of several nodes could not check on this host (it may be a
    login node, not one of the job's nodes); [] for one node, where everything is checked."""
    if nnodes == 1:
        return []
    notes = []
    if ifname is not None and ifname not in host.interfaces:
        notes.append(f"{_no_such_interface(ifname, host)}: not checked against the job's nodes; "
                     "check it there (`ip -br addr` lists them)")
    if master_addr is not None and node_rank != 0:
        try:
            socket.getaddrinfo(master_addr, None)
        except OSError as e:
            notes.append(f"--master-addr {master_addr} cannot be resolved on this host ({e.strerror or e}): "
                         "not checked against the job's nodes; pass node 0's IP address")
    return notes


def check_network(nnodes: int, node_rank: int, master_addr: str | None, ifname: str | None, host: Host,
                  *, elsewhere: bool = False) -> None:
    """Refuse the network options a multi-node job would hang or fail on (see module doc).

    ``elsewhere``: the job is planned here for other hosts (the dry run of a job of several
    nodes), so what only they can answer is left to ``not_checked_here``."""
    if ifname is not None and ifname not in host.interfaces and not elsewhere:
        raise DancegrpoError(
            _no_such_interface(ifname, host),
            "name the interface on the network between the nodes (`ip -br addr` lists them)",
            exit_code=2,
        )
    if nnodes == 1:
        return
    if master_addr is None:
        raise DancegrpoError(
            f"--nnodes {nnodes} needs --master-addr: without it each node would wait for itself",
            "pass --master-addr with node 0's address on the network between the nodes, the same on every node",
            exit_code=2,
        )
    if node_rank == 0:
        return
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(master_addr, None)}
    except OSError as e:
        if elsewhere:
            return
        raise DancegrpoError(
            f"--master-addr {master_addr} cannot be resolved on this host ({e.strerror or e})",
            "pass node 0's IP address",
            exit_code=2,
        ) from None
    own = sorted(a for a in resolved if _is_loopback(a) or a in host.addresses)
    if own:
        raise DancegrpoError(
            f"--node-rank {node_rank} with --master-addr {master_addr}: that is this host ({own[0]}), "
            "but node 0 is another host",
            "pass node 0's address as --master-addr (run `hostname -I` on node 0), or launch this node as --node-rank 0",
            exit_code=2,
        )
