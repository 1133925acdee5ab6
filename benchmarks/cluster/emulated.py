"""An emulated cluster on one Linux machine (root): one network namespace per node, a real TCP
network between them, each node's link shaped to a rate, MPI jobs launched across the nodes.

Layout of a cluster named NAME (``hpcopt-<pid>-<random>``: unique per run, and the creating
process is known, so ``down --stale`` can find clusters whose creator died):

- ``NAME-sw``: the switch, a bridge; ``NAME-n0`` ... ``NAME-n<N-1>``: the nodes, node i at
  10.77.0.(i+1); ``NAME-hd``: the launch host (10.77.0.254), where ``mpiexec`` runs. Each is
  joined to the bridge by a veth pair whose ends are created inside the namespaces, so nothing
  is added to the machine's own network namespace.
- each node's link is shaped with ``tbf`` in both directions (the node's egress and the switch
  port's), the bucket large enough for one 64 KB offload packet (with 16 KB, a 1gbit link
  carried 277 Mbit/s instead of 727).
  There is no delay emulation (``netem`` is not available everywhere).
- MPICH's hydra starts the ranks through a generated ``ssh`` stand-in that runs a command in the
  namespace owning a host, so MPICH sees ``N`` nodes (one per ``-hosts`` entry) and its
  shared-memory split gives one group per node.
- MPICH's UCX netmod would move bytes between namespaces through shared memory (it sees one
  machine); ``NETMODS`` keeps both netmods on the network: UCX with ``UCX_TLS=tcp,self``, OFI
  with libfabric's ``tcp`` provider. ``link_bytes`` reads the kernel's per-link counters, so a
  caller can check that the bytes really crossed.

Clean-up: the context manager's exit, ``atexit`` and (from the command line) SIGTERM/SIGINT/SIGHUP
all tear the cluster down: the processes left in its namespaces are killed, the namespaces
deleted. Only a SIGKILL of the creator leaves one behind: ``down --stale`` removes it.

Command line (as root)::

    python -m benchmarks.cluster.emulated run --nodes 2 --ppn 2 --rate 100mbit [--netmod ofi] \\
        [--load N] -- python -m hpcopt train --dataset digits --steps 64
    python -m benchmarks.cluster.emulated list
    python -m benchmarks.cluster.emulated down --stale | --all

Without namespaces, ``mpiexec -launcher fork -hosts a,b -ppn K`` still gives MPICH two "nodes"
(it decides nodes from hydra's node map), with no network between them.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common.load import busy

PREFIX = "hpcopt"
SUBNET = "10.77.0"
LAUNCH_HOST = f"{SUBNET}.254"
#: Every node's end of its link (the same name in each node's namespace).
UPLINK = "uplink"
#: The tbf bucket holds at least one offload packet (64 KB plus headers) ...
OFFLOAD_PACKET_BYTES = 68 << 10
#: ... or this long at the rate, if that is more.
BUCKET_SECONDS = 1e-3
#: Environment that keeps MPICH's netmods on the network between nodes (MPICH's own shared
#: memory still serves the ranks of one node).
NETMODS = {
    "ucx": {"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": UPLINK},
    "ofi": {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": UPLINK},
}
#: ``tc`` rates: 100mbit, 1gbit, 2.5gbit, 500kbit ...; "none": unshaped.
_RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kmg]?)bit")
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def rate_bits(rate: str) -> float | None:
    """Bits per second of a ``tc`` rate ("100mbit": 1e8); None for "none" (unshaped)."""
    if rate == "none":
        return None
    match = _RATE.fullmatch(rate.lower())
    if match is None:
        raise ValueError(f"a rate is like 100mbit, 1gbit or none, not {rate!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def bucket_bytes(bits_per_second: float) -> int:
    """The tbf bucket for a rate: one offload packet, or ``BUCKET_SECONDS`` of the rate."""
    return max(OFFLOAD_PACKET_BYTES, int(bits_per_second / 8 * BUCKET_SECONDS))


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """The network namespaces of the machine, by name."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def namespaces_unavailable() -> str:
    """Why no emulated cluster can be made here ("" when one can): ``ip netns add`` must work."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the ip and tc commands (iproute2) are not installed"
    probe = f"{PREFIX}-probe-{os.getpid()}-{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode:
        return f"'ip netns add' is not permitted here ({done.stderr.strip() or 'needs root'})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


@dataclass
class Job:
    """An MPI job that ran on the cluster."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    sent: list[int] = field(default_factory=list)      # bytes each node sent on its link
    received: list[int] = field(default_factory=list)  # bytes each node received on it

    def describe(self) -> str:
        return (f"exit {self.returncode} after {self.seconds:.1f} s; bytes sent per node {self.sent}\n"
                f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}")


class EmulatedCluster:
    """``nodes`` network namespaces of ``ranks_per_node`` ranks each, every link shaped to
    ``rate`` (see the module docstring). Use as a context manager, or ``up()`` and ``down()``."""

    def __init__(self, nodes: int, ranks_per_node: int, rate: str = "none") -> None:
        if not 1 <= nodes <= 253:
            raise ValueError(f"nodes must be in 1..253, got {nodes}")
        if ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
        rate_bits(rate)  # checked before anything is made
        self.nodes, self.ranks_per_node, self.rate = nodes, ranks_per_node, rate
        self.name = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch, self.launch_host = f"{self.name}-sw", f"{self.name}-hd"
        self.node_names = [f"{self.name}-n{i}" for i in range(nodes)]
        self.hosts = [f"{SUBNET}.{i + 1}" for i in range(nodes)]
        self._made: list[str] = []
        self._scratch: Path | None = None

    # -- life cycle --------------------------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """Make the switch, the launch host and the nodes, and shape every link. SIGTERM, SIGINT
        and SIGHUP wait until it is done (or has failed and removed what it made): one that came
        between ``ip netns add`` and its record would leave that namespace behind."""
        atexit.register(self.down)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED_SIGNALS)
        try:
            self._add(self.switch)
            _ip("-n", self.switch, "link", "add", "switch", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "switch", "up")
            self._attach(self.launch_host, "porthd", LAUNCH_HOST)
            for i, (node, host) in enumerate(zip(self.node_names, self.hosts)):
                self._attach(node, f"port{i}", host)
            self.shape(self.rate)
            self._scratch = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
            self._write_launcher(self._scratch / "ssh")
        except BaseException:
            self.down()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def down(self) -> None:
        """Kill what runs in the cluster's namespaces and delete them (idempotent)."""
        for namespace in reversed(self._made):
            remove_namespace(namespace)
        self._made.clear()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        atexit.unregister(self.down)

    def _add(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        self._made.append(namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")

    def _attach(self, namespace: str, port: str, address: str) -> None:
        """A new namespace joined to the switch at ``port`` by a veth pair, at ``address``."""
        self._add(namespace)
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", UPLINK,
            "netns", namespace)
        _ip("-n", self.switch, "link", "set", port, "master", "switch", "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", UPLINK)
        _ip("-n", namespace, "link", "set", UPLINK, "up")

    def _write_launcher(self, path: Path) -> None:
        """hydra's ``ssh`` stand-in: ``ssh [options] HOST COMMAND`` runs COMMAND in HOST's node."""
        cases = "\n".join(f"    {host}) ns={node} ;;" for host, node in zip(self.hosts, self.node_names))
        path.write_text(f"""#!/bin/sh
# ssh for hydra on the emulated cluster {self.name}: runs the command in the node owning HOST
while [ $# -gt 0 ]; do
  case $1 in
    -[46AaCfGgKkMNnqsTtVvXxYy]) shift ;;
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
    *) break ;;
  esac
done
host=$1; shift
case $host in
{cases}
    *) echo "emulated cluster {self.name}: no host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" sh -c "$*"
""")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)

    # -- the links ---------------------------------------------------------------------------

    def shape(self, rate: str) -> None:
        """Shape every node's link to ``rate`` in both directions ("none": unshaped)."""
        bits = rate_bits(rate)
        for i, node in enumerate(self.node_names):
            for namespace, device in ((node, UPLINK), (self.switch, f"port{i}")):
                subprocess.run(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"],
                               capture_output=True)  # none yet is fine
                if bits is not None:
                    done = subprocess.run(
                        ["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf",
                         "rate", rate, "burst", str(bucket_bytes(bits)), "latency", "20ms"],
                        capture_output=True, text=True)
                    if done.returncode:
                        raise RuntimeError(f"tc on {namespace}/{device}: {done.stderr.strip()}")
        self.rate = rate

    def link_bytes(self) -> tuple[list[int], list[int]]:
        """(bytes sent, bytes received) on each node's link so far: the kernel's counters of
        its end of the link (``/sys/class/net/uplink/statistics`` inside the node)."""
        sent, received = [], []
        for node in self.node_names:
            counters = [int(_ip("netns", "exec", node, "cat",
                                f"/sys/class/net/{UPLINK}/statistics/{name}").strip())
                        for name in ("tx_bytes", "rx_bytes")]
            sent.append(counters[0])
            received.append(counters[1])
        return sent, received

    def link_down(self, node: int) -> None:
        """Cut node ``node``'s cable at the switch: its packets go nowhere, nothing reaches it
        (both ends keep their carrier, as when a switch or cable fails further away)."""
        _ip("-n", self.switch, "link", "set", f"port{node}", "nomaster")

    def link_up(self, node: int) -> None:
        """Plug node ``node``'s cable back in."""
        _ip("-n", self.switch, "link", "set", f"port{node}", "master", "switch")

    # -- jobs --------------------------------------------------------------------------------

    def mpiexec_command(self, command: list[str], netmod: str = "ofi", timeout: float = 300) -> list[str]:
        """The command line that runs ``command`` as ``nodes x ranks_per_node`` MPI ranks from the
        launch host, bounded by ``timeout -k 5 TIMEOUT``."""
        if netmod not in NETMODS:
            raise ValueError(f"netmod must be one of {sorted(NETMODS)}, got {netmod!r}")
        if self._scratch is None:
            raise RuntimeError(f"the emulated cluster {self.name} is not up")
        netenv = [f"{key}={value}" for key, value in NETMODS[netmod].items()]
        return ["timeout", "-k", "5", str(int(timeout)), "ip", "netns", "exec", self.launch_host,
                "env", *netenv, "mpiexec", "-launcher", "ssh", "-launcher-exec", str(self._scratch / "ssh"),
                "-localhost", LAUNCH_HOST, "-hosts", ",".join(self.hosts),
                "-n", str(self.nodes * self.ranks_per_node), "-ppn", str(self.ranks_per_node), *command]

    def launch(self, command: list[str], netmod: str = "ofi", timeout: float = 300,
               env: dict[str, str] | None = None, cwd: str | Path | None = None) -> subprocess.Popen:
        """Start ``command`` on every rank (see ``mpiexec_command``); its output is piped. The
        ranks inherit ``env`` (default: this process's environment)."""
        return subprocess.Popen(self.mpiexec_command(command, netmod, timeout), env=env, cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    def mpiexec(self, command: list[str], netmod: str = "ofi", timeout: float = 300,
                env: dict[str, str] | None = None, cwd: str | Path | None = None) -> Job:
        """Run ``command`` on every rank to its end (at most ``timeout`` seconds); the job, with
        the bytes each node sent and received on its link meanwhile."""
        before = self.link_bytes()
        start = time.monotonic()
        process = self.launch(command, netmod, timeout, env, cwd)
        stdout, stderr = process.communicate()
        seconds = time.monotonic() - start
        after = self.link_bytes()
        return Job(process.returncode, stdout, stderr, seconds,
                   [b - a for a, b in zip(before[0], after[0])],
                   [b - a for a, b in zip(before[1], after[1])])

    def kill_jobs(self) -> None:
        """SIGKILL every process left in the nodes and the launch host (e.g. ranks a cut link
        kept from hearing that their job was aborted)."""
        for namespace in (self.launch_host, *self.node_names):
            _kill_all(namespace)

    def node_pids(self, node: int) -> list[int]:
        """The processes running in node ``node`` (hydra's proxy, the ranks, their shells)."""
        return [int(pid) for pid in _ip("netns", "pids", self.node_names[node]).split()]

    def signal_node(self, node: int, signum: int) -> list[int]:
        """Send ``signum`` to every process of node ``node`` at once; their pids."""
        pids = self.node_pids(node)
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return pids


def _kill_all(namespace: str) -> None:
    """SIGKILL every process in ``namespace``."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    for pid in pids.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_namespace(namespace: str) -> None:
    """Kill the processes in ``namespace`` (they would keep its links alive) and delete it."""
    _kill_all(namespace)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def clusters() -> dict[str, int]:
    """Emulated clusters on this machine: name -> the pid of the process that made it."""
    found = {}
    for namespace in namespaces():
        match = re.fullmatch(rf"({PREFIX}-([0-9]+)-[0-9a-f]+)-(?:sw|hd|n[0-9]+)", namespace)
        if match:
            found[match.group(1)] = int(match.group(2))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_clusters(stale_only: bool) -> list[str]:
    """Remove the emulated clusters (only those whose maker has exited, with ``stale_only``)."""
    removed = []
    for name, pid in sorted(clusters().items()):
        if stale_only and _alive(pid):
            continue
        for namespace in namespaces():
            if namespace.startswith(f"{name}-"):
                remove_namespace(namespace)
        removed.append(name)
    return removed


#: The signals that end the command line's cluster (``main``), held while one is being made.
DEFERRED_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def add_bookkeeping(commands: Any, kind: str) -> None:
    """The ``list`` and ``down --stale|--all`` commands of a cluster's command line."""
    commands.add_parser("list", help=f"the {kind} clusters on this machine and their makers")
    down = commands.add_parser("down", help=f"remove {kind} clusters")
    which = down.add_mutually_exclusive_group(required=True)
    which.add_argument("--stale", action="store_true", help="those whose maker has exited")
    which.add_argument("--all", action="store_true", help="all of them")


def bookkeeping(args: argparse.Namespace, found: Callable[[], dict[str, int]],
                remove: Callable[[bool], list[str]]) -> int:
    """Run ``list`` (the clusters ``found`` names, and their makers) or ``down`` (``remove``)."""
    if args.command == "list":
        for name, pid in sorted(found().items()):
            print(f"{name}  made by pid {pid} ({'running' if _alive(pid) else 'exited'})")
    else:
        for name in remove(args.stale):
            print(f"removed {name}")
    return 0


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster.emulated", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="make a cluster, run one MPI job on it, remove it")
    run.add_argument("--nodes", type=int, default=2)
    run.add_argument("--ppn", type=int, default=2, help="ranks per node")
    run.add_argument("--rate", default="100mbit", help="each link's rate: 100mbit, 1gbit, none")
    run.add_argument("--netmod", choices=sorted(NETMODS), default="ofi")
    run.add_argument("--timeout", type=float, default=600, help="seconds the job may run")
    run.add_argument("--load", type=int, default=0, metavar="N",
                     help="N busy processes on the same cores while the job runs (benchmarks/common/load.py)")
    run.add_argument("job", nargs=argparse.REMAINDER, help="-- COMMAND ...: what every rank runs")
    add_bookkeeping(commands, "emulated")
    args = parser.parse_args(argv)
    if args.command in ("list", "down"):
        return bookkeeping(args, clusters, remove_clusters)
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job:
        parser.error("run: give the command after --")
    reason = namespaces_unavailable()
    if reason:
        print(f"emulated cluster: {reason}", file=sys.stderr)
        return 2
    for signum in DEFERRED_SIGNALS:
        signal.signal(signum, _raise_exit)  # the with block's exit removes the cluster
    with EmulatedCluster(args.nodes, args.ppn, args.rate) as cluster, busy(args.load) as load:
        done = cluster.mpiexec(job, args.netmod, args.timeout)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    print(f"# emulated cluster: {args.nodes} node(s) x {args.ppn} rank(s), {args.rate}, {args.netmod}, "
          f"{load.describe()}: exit {done.returncode} after {done.seconds:.1f} s; MB sent per node "
          + " ".join(f"{b / 1e6:.2f}" for b in done.sent), file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
