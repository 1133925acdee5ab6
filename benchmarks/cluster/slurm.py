"""A real Slurm on one Linux machine (root): ``slurmctld`` on a head node and one ``slurmd`` per
node, each node a network namespace of its own (its own address, hostname, ``/etc/hosts`` and
``/sys``), all sharing the machine's file system; every link can be shaped to a rate.

Layout of a cluster named NAME (``hpslurm-<pid>-<random>``: unique per run, and the creating
process is known, so ``down --stale`` finds clusters whose creator died):

- ``NAME-hd``: the head node at 10.78.0.254, holding the switch (a bridge), ``slurmctld`` and the
  clients (``sbatch``, ``squeue``, ``scontrol``, ``srun``: :meth:`SlurmCluster.client`);
- ``NAME-n1`` ... ``NAME-n<N>``: the nodes, node i at 10.78.0.i, each with its ``slurmd``; its end
  of the link is ``uplink`` (as in benchmarks/cluster/emulated.py), the switch's ``port<i>``;
- ``$TMPDIR/NAME``: ``slurm.conf`` (and each node's copy beside its own ``mpi.conf``), the
  controller's state, the spool, the logs, the pid files, and munge's key and socket. Nothing is
  read from ``/etc/slurm`` or ``/etc/munge``; the machine's ``/etc/hosts`` is untouched (each
  namespace gets ``/etc/netns/<namespace>/hosts``).

``slurm.conf`` keeps Debian's (and many sites') ``MpiDefault=none``: a bare ``srun`` starts
singletons under the MPICH and Open MPI wheels, as on such a site. Reactions are quick for a test
cluster (``SlurmdTimeout=10``, ``sched_interval=2``); each node declares ``cpus`` CPUs.

Measured facts this follows (each cost hours to find): slurmd 22.05 refuses to start without a
cgroup mount, which ``ip netns exec`` hides, so the daemons start with ``nsenter --net`` and a
private mount namespace in which a fresh sysfs (libfabric and UCX read the node's own
interfaces there) gets the cgroup tree bound back under it; nodes that share ``/tmp`` collide on
PMIx's directories, so each node's ``mpi.conf`` names its own; MPICH's default netmod sends
nothing over links between namespaces of one kernel, so a job keeps it on the network with
:data:`MPICH_ON_THE_NETWORK`; a requeued job may start only 121 s later unless told
``StartTime=now``; ``sbatch --wait`` polls slowly, so :meth:`SlurmCluster.wait_gone` polls
``squeue``.

Clean-up: the context manager's exit and ``atexit`` stop the daemons and every process left in
the cluster's namespaces, delete the namespaces and the runtime directory; ``down --stale``
removes a cluster whose creator was killed.

Command line (as root, with Debian's ``slurm-wlm`` and ``munge`` installed)::

    python -m benchmarks.cluster.slurm run --nodes 2 -- sbatch --wrap 'srun hostname'   # up, run, down
    python -m benchmarks.cluster.slurm list
    python -m benchmarks.cluster.slurm down --stale | --all
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.cluster.emulated import (
    DEFERRED_SIGNALS,
    UPLINK,
    _alive,
    _ip,
    _raise_exit,
    add_bookkeeping,
    bookkeeping,
    bucket_bytes,
    namespaces,
    namespaces_unavailable,
    rate_bits,
    remove_namespace,
)

PREFIX = "hpslurm"
SUBNET = "10.78.0"
HEAD_ADDRESS = f"{SUBNET}.254"
#: The programs a cluster needs (Debian: slurm-wlm, munge, util-linux, iproute2).
PROGRAMS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scontrol", "nsenter", "unshare")
#: Keeps MPICH's ranks on the network between nodes (its default netmod would use shared
#: memory: the nodes are one kernel); Open MPI's TCP transport on the node's own link.
MPICH_ON_THE_NETWORK = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": UPLINK}
OPEN_MPI_ON_THE_NETWORK = {"OMPI_MCA_btl_tcp_if_include": UPLINK, "OMPI_MCA_oob_tcp_if_include": UPLINK}
#: The states of a job that has ended (``squeue -t all``).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT")
#: Seconds a requeued job is left pending before :meth:`SlurmCluster.start_now` lets it start.
REQUEUE_SETTLE_SECONDS = 3.0
#: A clean environment for the daemons and the jobs: a job gets what sbatch's caller exports.
BASE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def slurm_unavailable() -> str:
    """Why no Slurm cluster can be made here ("" when one can): root, Slurm's and munge's
    programs, and ``ip netns add``."""
    if os.geteuid() != 0:
        return "it needs root (slurmd, munged and network namespaces)"
    missing = [program for program in PROGRAMS if shutil.which(program, path=BASE_PATH) is None]
    if missing:
        return (f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge "
                "libpmi2-0 libpmix-dev)")
    return namespaces_unavailable()


class SlurmCluster:
    """A controller and ``nodes`` slurmd nodes of ``cpus`` CPUs each, every link shaped to
    ``rate`` (see the module docstring). Use as a context manager, or ``up()`` and ``down()``."""

    def __init__(self, nodes: int = 2, cpus: int = 2, rate: str = "none") -> None:
        if not 1 <= nodes <= 253:
            raise ValueError(f"nodes must be in 1..253, got {nodes}")
        rate_bits(rate)
        self.nodes, self.cpus, self.rate = nodes, cpus, rate
        self.name = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.head = f"{self.name}-hd"
        self.node_names = [f"{self.name}-n{i}" for i in range(1, nodes + 1)]
        self.addresses = [f"{SUBNET}.{i}" for i in range(1, nodes + 1)]
        self.runtime = runtime_directory(self.name)
        self.conf = self.runtime / "slurm.conf"
        self._made: list[str] = []

    # -- life cycle --------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self, timeout: float = 60) -> None:
        """Make the network, start munged, slurmctld and every slurmd, and wait until every
        node is idle (RuntimeError naming the daemon's log otherwise)."""
        atexit.register(self.down)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED_SIGNALS)
        try:
            self.runtime.mkdir(mode=0o700)
            for sub in ("state", "log", "run", "munge", "spool", "pmix"):
                (self.runtime / sub).mkdir(mode=0o700)
            self._network()
            self._munge()
            self._write_conf()
            self._start_controller()
            for i in range(1, self.nodes + 1):
                self.start_slurmd(i)
        except BaseException:
            self.down()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        self.wait_idle(timeout)

    def down(self) -> None:
        """Stop everything the cluster started and remove what it made (idempotent)."""
        _stop_daemons(self.runtime)
        for namespace in reversed(self._made):
            remove_namespace(namespace)
            shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)
        self._made.clear()
        shutil.rmtree(self.runtime, ignore_errors=True)
        atexit.unregister(self.down)

    def _network(self) -> None:
        self._add(self.head)
        _ip("-n", self.head, "link", "add", "switch", "type", "bridge")
        _ip("-n", self.head, "addr", "add", f"{HEAD_ADDRESS}/24", "dev", "switch")
        _ip("-n", self.head, "link", "set", "switch", "up")
        for i, (node, address) in enumerate(zip(self.node_names, self.addresses), start=1):
            self._add(node)
            _ip("-n", self.head, "link", "add", f"port{i}", "type", "veth", "peer", "name", UPLINK,
                "netns", node)
            _ip("-n", self.head, "link", "set", f"port{i}", "master", "switch", "up")
            _ip("-n", node, "addr", "add", f"{address}/24", "dev", UPLINK)
            _ip("-n", node, "link", "set", UPLINK, "up")
        hosts = "127.0.0.1 localhost\n" + f"{HEAD_ADDRESS} {self.head}\n" + "".join(
            f"{address} {node}\n" for node, address in zip(self.node_names, self.addresses))
        for namespace in self._made:
            folder = Path("/etc/netns") / namespace
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(hosts)
        self.shape(self.rate)

    def _add(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        self._made.append(namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")

    def _munge(self) -> None:
        """munged with a key of its own, on a socket in the runtime directory."""
        key = self.runtime / "munge" / "key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        munge = self.runtime / "munge"
        _checked(["munged", "--force", f"--socket={munge / 'socket'}", f"--key-file={key}",
                  f"--pid-file={self.runtime / 'run' / 'munged.pid'}", f"--seed-file={munge / 'seed'}",
                  f"--log-file={self.runtime / 'log' / 'munged.log'}"], "munged")

    def _write_conf(self) -> None:
        r = self.runtime
        lines = [
            f"ClusterName={self.name.replace('-', '')[:30]}",
            f"SlurmctldHost={self.head}({HEAD_ADDRESS})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={r / 'munge' / 'socket'}", "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            # no cgroups: the slurmd share one kernel (which may be a sandbox's)
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",  # Debian's default, and many sites': a bare srun starts singletons
            "ReturnToService=2", "SlurmdTimeout=10", "MessageTimeout=10", "KillWait=5",
            "MinJobAge=300", "InactiveLimit=0", "JobRequeue=1", "SchedulerParameters=sched_interval=2",
            "SlurmdParameters=config_overrides",
            f"NodeName=DEFAULT CPUs={self.cpus} State=UNKNOWN",
            *(f"NodeName={node} NodeAddr={address} NodeHostname={node}"
              for node, address in zip(self.node_names, self.addresses)),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        for node in self.node_names:  # each node reads its own folder: PMIx's directory is its own
            folder = self.runtime / "etc" / node
            folder.mkdir(parents=True)
            (folder / "slurm.conf").symlink_to(self.conf)
            (self.runtime / "pmix" / node).mkdir()
            (folder / "mpi.conf").write_text(f"PMIxCliTmpDirBase={self.runtime / 'pmix' / node}\n")

    def _environment(self) -> dict[str, str]:
        return {"PATH": BASE_PATH, "HOME": os.environ.get("HOME", "/root"), "SLURM_CONF": str(self.conf)}

    def _start_controller(self) -> None:
        _checked(["ip", "netns", "exec", self.head, "unshare", "--uts", "sh", "-c",
                  f'hostname {self.head}; exec slurmctld -f "$SLURM_CONF" -i'], "slurmctld",
                 env=self._environment())

    def start_slurmd(self, node: int) -> None:
        """(Re)start node ``node``'s slurmd (1-based), e.g. after :meth:`kill_node`."""
        name = self.node_names[node - 1]
        cgroups = self.runtime / f"cgroup-{node}"
        cgroups.mkdir(exist_ok=True)
        # a private mount namespace: the node's hostname and hosts file, a sysfs of its network
        # namespace, and the cgroup tree bound back under it (slurmd refuses to start without)
        setup = (f"hostname {name}; mount --bind /etc/netns/{name}/hosts /etc/hosts; "
                 f"mount --rbind /sys/fs/cgroup {cgroups}; mount -t sysfs {name} /sys; "
                 f"mount --rbind {cgroups} /sys/fs/cgroup; umount -l {cgroups}; "
                 f"exec slurmd -f {self.runtime / 'etc' / name / 'slurm.conf'} -N {name}")
        _checked(["nsenter", f"--net=/run/netns/{name}", "unshare", "--mount", "--uts",
                  "--propagation", "private", "sh", "-c", setup], f"slurmd of {name}",
                 env=self._environment())

    def revive(self) -> None:
        """Start the slurmd of every node whose daemon is gone (e.g. after :meth:`kill_node`)."""
        for i, name in enumerate(self.node_names, start=1):
            if _running(self.runtime / "run" / f"slurmd-{name}.pid") is None:
                self.start_slurmd(i)

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until every node is idle (RuntimeError after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.client(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], check=False)
            if len(done.stdout.split()) >= self.nodes:
                return
            time.sleep(0.25)
        raise RuntimeError(f"Slurm cluster {self.name}: not every node idle after {timeout:.0f} s "
                           f"(logs in {self.runtime / 'log'})")

    # -- the links ---------------------------------------------------------------------------

    def shape(self, rate: str) -> None:
        """Shape every node's link to ``rate`` in both directions ("none": unshaped)."""
        bits = rate_bits(rate)
        for i, node in enumerate(self.node_names, start=1):
            for namespace, device in ((node, UPLINK), (self.head, f"port{i}")):
                subprocess.run(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"],
                               capture_output=True)
                if bits is not None:
                    _checked(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf",
                              "rate", rate, "burst", str(bucket_bytes(bits)), "latency", "20ms"],
                             f"tc on {namespace}/{device}")
        self.rate = rate

    def cut_link(self, node: int) -> None:
        """Unplug node ``node``'s cable at the switch (1-based): nothing reaches it any more."""
        _ip("-n", self.head, "link", "set", f"port{node}", "nomaster")

    def mend_link(self, node: int) -> None:
        _ip("-n", self.head, "link", "set", f"port{node}", "master", "switch")

    def kill_node(self, node: int) -> list[int]:
        """SIGKILL every process of node ``node`` (1-based: its slurmd, job steps and ranks), as
        when it loses power; their pids."""
        pids = [int(p) for p in _ip("netns", "pids", self.node_names[node - 1]).split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    # -- clients -----------------------------------------------------------------------------

    def client_command(self, command: Sequence[str]) -> list[str]:
        """``command`` as run on the head node (its network namespace and hostname)."""
        return ["ip", "netns", "exec", self.head, "unshare", "--uts", "sh", "-c",
                f'hostname {self.head}; exec "$@"', "sh", *command]

    def client(self, command: Sequence[str], env: dict[str, str] | None = None,
               cwd: str | Path | None = None, check: bool = True,
               timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a Slurm client on the head node with a clean environment plus ``env`` (a job
        submitted so inherits only that); RuntimeError on a non-zero exit when ``check``."""
        done = subprocess.run(self.client_command(command), env={**self._environment(), **(env or {})},
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()}")
        return done

    def sbatch(self, script: str | Path, *options: str, env: dict[str, str] | None = None,
               cwd: str | Path | None = None) -> str:
        """Submit ``script`` (from ``cwd``); the job's id."""
        done = self.client(["sbatch", "--parsable", *options, str(script)], env=env, cwd=cwd)
        return done.stdout.strip().split(";")[0]

    def states(self, job: str) -> list[str] | None:
        """The states of ``job``'s entries (an array's tasks), ended ones included; None when
        the controller could not be asked."""
        done = self.client(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], check=False)
        return done.stdout.split() if done.returncode == 0 else None

    def wait_gone(self, job: str, timeout: float) -> None:
        """Wait until every entry of ``job`` has ended (TimeoutError after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.states(job)
            if states is not None and all(state in ENDED for state in states):
                return
            time.sleep(0.5)
        raise TimeoutError(f"job {job} not ended after {timeout:.0f} s: {self.states(job)}")

    def start_now(self, job: str, started: Callable[[], bool], timeout: float) -> None:
        """Let a requeued ``job`` start without Slurm's requeue delay (about 121 s): once it is
        PENDING and no node is still completing its old attempt, ``scontrol update
        StartTime=now``, again every 2 s (one made while the old attempt still completes can be
        overridden by the requeue's own begin time, or start the job on nodes whose credential
        is being revoked, which fails it), until ``started()`` (TimeoutError after ``timeout`` s)."""
        deadline, pending_since = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            if started():
                return
            completing = self.client(["sinfo", "-h", "-N", "-t", "completing", "-o", "%N"], check=False)
            pending = "PENDING" in (self.states(job) or []) and not completing.stdout.strip()
            pending_since = (pending_since or time.monotonic()) if pending else None
            # slurmd compares a revoked credential's time in whole seconds: a start in the same
            # second as the requeue is refused ("Job credential revoked") and fails the job
            if pending_since is not None and time.monotonic() - pending_since >= REQUEUE_SETTLE_SECONDS:
                self.client(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)
            for _ in range(8):
                if started():
                    return
                time.sleep(0.25)
        raise TimeoutError(f"job {job} did not start again within {timeout:.0f} s: {self.states(job)}")

    def wait_state(self, job: str, state: str, timeout: float) -> None:
        """Wait until an entry of ``job`` is in ``state`` (e.g. RUNNING)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if state in (self.states(job) or []):
                return
            time.sleep(0.25)
        raise TimeoutError(f"job {job} not {state} after {timeout:.0f} s: {self.states(job)}")


def runtime_directory(name: str) -> Path:
    return Path(tempfile.gettempdir()) / name


def _checked(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{what}: exit {done.returncode}: {(done.stderr or done.stdout).strip()}")


def _stop_daemons(runtime: Path) -> None:
    """SIGTERM the daemons named by the pid files under ``runtime``, SIGKILL after 5 s."""
    files = sorted((runtime / "run").glob("*.pid")) if (runtime / "run").is_dir() else []
    pids = [pid for pid in map(_running, files) if pid is not None]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid) and not _zombie(pid)]
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _running(pid_file: Path) -> int | None:
    """The process a daemon's pid file names, while it runs (not a zombie); else None."""
    text = pid_file.read_text().strip() if pid_file.is_file() else ""
    return int(text) if text.isdigit() and _alive(int(text)) and not _zombie(int(text)) else None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def clusters() -> dict[str, int]:
    """Slurm clusters on this machine: name -> the pid of the process that made it."""
    found = {}
    for namespace in namespaces():
        match = re.fullmatch(rf"({PREFIX}-([0-9]+)-[0-9a-f]+)-(?:hd|n[0-9]+)", namespace)
        if match:
            found[match.group(1)] = int(match.group(2))
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}-*"):
        match = re.fullmatch(rf"{PREFIX}-([0-9]+)-[0-9a-f]+", folder.name)
        if match:
            found[folder.name] = int(match.group(1))
    return found


def remove_clusters(stale_only: bool) -> list[str]:
    """Remove the Slurm clusters (only those whose maker has exited, with ``stale_only``)."""
    removed = []
    for name, pid in sorted(clusters().items()):
        if stale_only and _alive(pid):
            continue
        _stop_daemons(runtime_directory(name))
        for namespace in namespaces():
            if namespace.startswith(f"{name}-"):
                remove_namespace(namespace)
                shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)
        shutil.rmtree(runtime_directory(name), ignore_errors=True)
        removed.append(name)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster.slurm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="bring a cluster up, run one client command on its head, "
                              "wait for the jobs it submitted, take it down")
    run.add_argument("--nodes", type=int, default=2)
    run.add_argument("--cpus", type=int, default=2, help="CPUs each node declares")
    run.add_argument("--rate", default="none", help="each link's rate: 100mbit, 1gbit, none")
    run.add_argument("--timeout", type=float, default=600, help="seconds the jobs may take")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...: e.g. sbatch job.sh")
    add_bookkeeping(commands, "Slurm")
    args = parser.parse_args(argv)
    if args.command in ("list", "down"):
        return bookkeeping(args, clusters, remove_clusters)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run: give the client command after --")
    reason = slurm_unavailable()
    if reason:
        print(f"Slurm cluster: {reason}", file=sys.stderr)
        return 2
    for signum in DEFERRED_SIGNALS:
        signal.signal(signum, _raise_exit)
    with SlurmCluster(args.nodes, args.cpus, args.rate) as cluster:
        done = cluster.client(command, env={"PATH": os.environ["PATH"]}, cwd=os.getcwd(), check=False)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and cluster.client(["squeue", "-h"], check=False).stdout.strip():
            time.sleep(0.5)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
