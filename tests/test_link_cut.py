"""The cdc-mirror drill's link cut (drills/cdc_mirror.py LinkCut) changes the host's iptables:
rules a drill killed -9 mid-cut could not heal must not outlive it. Each rule names the drill
process that cut; the next drill deletes those of dead processes and only those."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ordq.drills.cdc_mirror import CUT_TAG, LinkCut, sweep_leftover_cuts


def _no_iptables() -> str | None:
    """Why this machine cannot change iptables (not root, no iptables, no netfilter), or None."""
    if os.geteuid() != 0:
        return "not root"
    try:
        probe = subprocess.run(["iptables", "-w", "5", "-S", "OUTPUT"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if probe.returncode == 0 else probe.stderr.strip() or f"exit {probe.returncode}"


_WHY_NOT = _no_iptables()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the link cut needs iptables as root: {_WHY_NOT}")

UNUSED_GID = 59_999  # no process runs with it: the rules drop nothing


def rules() -> list[str]:
    out = subprocess.run(["iptables", "-w", "5", "-S", "OUTPUT"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if CUT_TAG in line]


def test_a_killed_drills_cut_is_swept_and_a_live_ones_kept() -> None:
    """Guard: sweep_leftover_cuts (run by every new LinkCut) deletes the rules of dead drills."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = ["OUTPUT", "-p", "tcp", "-m", "owner", "--gid-owner", str(UNUSED_GID), "--dport", "9",
                "-m", "comment", "--comment", f"{CUT_TAG}{dead.pid}", "-j", "DROP"]
    subprocess.run(["iptables", "-w", "5", "-I", *leftover], check=True)
    live = LinkCut(gid=UNUSED_GID)  # sweeps on creation
    try:
        assert not any(f"{CUT_TAG}{dead.pid} " in f"{line} " for line in rules())
        live.cut([9])
        mine = [line for line in rules() if f"{CUT_TAG}{os.getpid()} " in f"{line} "]
        assert len(mine) == 1
        assert sweep_leftover_cuts() == []  # this process lives: its cut stays until it heals
        assert len([line for line in rules() if f"{CUT_TAG}{os.getpid()} " in f"{line} "]) == 1
    finally:
        live.heal()
    assert not any(f"{CUT_TAG}{os.getpid()} " in f"{line} " for line in rules())
