"""A real single-node Slurm on localhost for the tests (no stand-in sbatch): munged, slurmctld
and slurmd from Debian's `munge` and `slurm-wlm`, started as plain child processes (no
systemd) with a throwaway munge key and slurm.conf in a temporary folder, on free loopback
ports; the node has 2 CPUs. `start` waits until `sinfo` shows the node idle; `stop` cancels
every job and ends the three daemons it started, by their pids."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "srun")
START_TIMEOUT_S = 60.0


def why_not() -> str | None:
    """Why a localhost Slurm cannot be had here (None: it can)."""
    missing = [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b) is None]
    if missing:
        return (
            f"no Slurm here ({', '.join(missing)} not found): apt-get install slurm-wlm munge "
            "(Debian 12), as root"
        )
    if os.geteuid() != 0:
        return "a localhost Slurm runs as root (SlurmUser=root, slurmd)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalSlurm:
    root: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        munge = self.root / "munge"
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge.chmod(0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = munge / "munge.socket"
        self._spawn(
            # --force: pytest's temporary folders are private (0700), which munged would refuse
            # for its socket (only this user's processes talk to it here)
            ["munged", "-F", "--force", f"--key-file={key}", f"--socket={socket_path}",
             f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
             f"--seed-file={munge / 'munged.seed'}"]
        )  # fmt: skip
        _wait(lambda: socket_path.exists(), "munged's socket")
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=taperlmtest",
                    "SlurmctldHost=localhost",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={socket_path}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=30",
                    "InactiveLimit=0",
                    "KillWait=5",
                    "MinJobAge=300",
                    "NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 State=UNKNOWN",
                    "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", "localhost"])
        _wait(self._idle, "the node to be idle in sinfo")

    def _spawn(self, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{cmd[0]}.stdout", "ab")  # noqa: SIM115 (the daemon's)
        self.procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env())
        )
        log.close()

    def _idle(self) -> bool:
        r = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], env=self.env(), capture_output=True, text=True
        )
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def jobs(self) -> list[str]:
        """Every job id (array tasks one by one) the controller knows: queued or running."""
        r = subprocess.run(
            ["squeue", "-h", "-r", "-o", "%i|%T"], env=self.env(), capture_output=True, text=True
        )
        return [ln.split("|")[0] for ln in r.stdout.split()]

    def running(self) -> list[str]:
        r = subprocess.run(
            ["squeue", "-h", "-r", "-t", "RUNNING", "-o", "%i"],
            env=self.env(),
            capture_output=True,
            text=True,
        )
        return r.stdout.split()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--user", "root"], env=self.env(), timeout=30)
            _wait(lambda: not self.jobs(), "the jobs to end", timeout=30)
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _wait(ready, what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")
