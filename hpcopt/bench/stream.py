"""A raw TCP stream from one node to another: what the link carries as TCP payload, the ceiling
of any MPI transfer across it (``bench allreduce --stream``).

The first rank of the second node listens on every address it has (an ephemeral port) and sends
the port and its IPv4 addresses (its interfaces', loopback left out: ``SIOCGIFADDR``, Linux) to
the first rank of the first node, which connects to the first that answers and sends ``nbytes``
of zeros in 1 MB writes. The receiver times from the first byte to the last (connection set-up
left out) and every rank gets the rate. The nodes are ``MPI_COMM_TYPE_SHARED`` groups, as MPI
sees them; on a machine with several networks the stream takes whichever the addresses reach
first, which need not be the one MPI uses (on the emulated cluster each node has one).
"""

from __future__ import annotations

import fcntl
import socket
import struct
import time

from mpi4py import MPI

#: ioctl that reads an interface's IPv4 address (linux/sockios.h).
SIOCGIFADDR = 0x8915
#: Seconds to wait for the connection, and for each read.
TIMEOUT = 20.0
CHUNK = 1 << 20


def ipv4_addresses() -> list[str]:
    """This host's (this network namespace's) IPv4 addresses, loopback left out."""
    found = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127."):
                found.append(address)
    finally:
        probe.close()
    return found


def _receive(listener: socket.socket) -> float:
    """Accept one connection, read it to its end; bytes per second from first byte to last."""
    connection, _ = listener.accept()
    with connection:
        connection.settimeout(TIMEOUT)
        buffer = bytearray(CHUNK)
        got = connection.recv_into(buffer)
        start = time.perf_counter()
        first = got
        while True:
            n = connection.recv_into(buffer)
            if not n:
                break
            got += n
        seconds = time.perf_counter() - start
    return (got - first) / seconds if seconds > 0 and got > first else 0.0


def _send(addresses: list[str], port: int, nbytes: int) -> bool:
    """Connect to the first of ``addresses`` that answers and send ``nbytes``; whether it did."""
    for address in addresses:
        try:
            connection = socket.create_connection((address, port), timeout=TIMEOUT)
        except OSError:
            continue
        with connection:
            data = bytes(CHUNK)
            sent = 0
            while sent < nbytes:
                connection.sendall(data[:min(CHUNK, nbytes - sent)])
                sent += min(CHUNK, nbytes - sent)
        return True
    return False


def stream_rate(world: MPI.Comm, nbytes: int) -> float | None:
    """Bytes per second of one TCP stream of ``nbytes`` from the first node's first rank to the
    second node's (module docstring), on every rank; None on one node, or where no address of
    the second node answered. Collective over ``world``."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        first = node.Get_rank() == 0
        leaders = world.allgather(world.Get_rank() if first else None)
    finally:
        node.Free()
    firsts = [rank for rank in leaders if rank is not None]
    if len(firsts) < 2:
        return None
    sender, receiver = firsts[0], firsts[1]
    rank = world.Get_rank()
    rate: float | None = None
    if rank == receiver:
        listener = socket.create_server(("0.0.0.0", 0))
        listener.settimeout(TIMEOUT)
        with listener:
            world.send((listener.getsockname()[1], ipv4_addresses()), dest=sender, tag=77)
            try:
                rate = _receive(listener) or None
            except OSError:
                rate = None
    elif rank == sender:
        port, addresses = world.recv(source=receiver, tag=77)
        _send(addresses, port, nbytes)
    return world.bcast(rate, root=receiver)
