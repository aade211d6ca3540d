"""What the multi-host tests share: scripts/hosts.sh under a prefix of the test's own, the removal of namespaces
that an earlier run of the same test left behind (killed by a timeout before it could tear down), and a run of
the test's body between `hosts.sh up 2` and `hosts.sh down`, skipped (exit 77) where namespaces cannot be made."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS_SH = os.path.join(HERE, "..", "..", "scripts", "hosts.sh")
SKIP = 77


def hosts(prefix: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["bash", HOSTS_SH, "--prefix", prefix, *map(str, args)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    if check and p.returncode != 0:
        raise RuntimeError(f"hosts.sh {' '.join(map(str, args))} exited {p.returncode}: {p.stderr.strip()}")
    return p


def remove_stale_sets(tag: str) -> None:
    """Namespaces <tag><pid>-* of earlier runs whose process is gone."""
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    for pid in sorted({m.group(1) for m in re.finditer(rf"^{tag}(\d+)-", out, re.M)}):
        if not os.path.exists(f"/proc/{pid}"):
            print(f"removing namespaces left by an earlier run (pid {pid} is gone)")
            hosts(f"{tag}{pid}", "down", check=False)


def on_two_hosts(tag: str, checks, body) -> None:
    """Runs body(prefix) on 2 fresh hosts named <tag><pid>-*, tears them down whatever happens, checks that no
    namespace is left, and finishes the tally (exits 77 when hosts cannot be made here)."""
    if not shutil.which("mpirun"):
        checks.fatal("mpirun is not on PATH (install openmpi-bin: bash scripts/setup.sh mpi)")
    remove_stale_sets(tag)
    prefix = f"{tag}{os.getpid()}"
    up = hosts(prefix, "up", 2, check=False)
    if up.returncode == 3:
        print(f"SKIPPED: {up.stderr.strip()}")
        sys.exit(SKIP)
    if not checks.check(up.returncode == 0, f"hosts.sh up 2 exited {up.returncode}: {up.stderr.strip()}"):
        checks.finish()
    try:
        body(prefix)
    finally:
        hosts(prefix, "down", check=False)
        left = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
        checks.check(f"{prefix}-" not in left, f"hosts.sh down left namespaces behind: {left}")
    checks.finish()
