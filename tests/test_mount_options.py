"""A broker warns at start when its data folder's file system discards online (mount_options.py)."""

from __future__ import annotations

from pathlib import Path

from ordq.broker_group.mount_options import mount_of, online_discard_warning

MOUNTS = """\
/dev/vda / ext4 rw,relatime,discard 0 0
proc /proc proc rw,nosuid 0 0
/dev/vdb /srv/ordq ext4 rw,relatime 0 0
/dev/vdc /srv/ordq\\040data xfs rw,discard 0 0
/dev/vdd /srv/ordq ext4 rw,noatime,discard 0 0
"""


def test_the_longest_mount_point_holding_the_folder_wins() -> None:
    assert mount_of(Path("/var/lib/ordq"), MOUNTS) == ("/", "ext4", frozenset({"rw", "relatime", "discard"}))
    assert mount_of(Path("/srv/ordq data/g1"), MOUNTS)[:2] == ("/srv/ordq data", "xfs")  # type: ignore[index]
    # /srv/ordqx is not under /srv/ordq
    assert mount_of(Path("/srv/ordqx"), MOUNTS)[0] == "/"  # type: ignore[index]


def test_a_later_mount_on_the_same_point_hides_the_earlier() -> None:
    assert "discard" in mount_of(Path("/srv/ordq/g1"), MOUNTS)[2]  # type: ignore[index]
    without_last = MOUNTS.splitlines()[:-1]
    assert "discard" not in mount_of(Path("/srv/ordq/g1"), "\n".join(without_last))[2]  # type: ignore[index]


def test_warns_only_for_online_discard(tmp_path: Path) -> None:
    warning = online_discard_warning(Path("/var/lib/ordq"), MOUNTS)
    assert warning is not None and "mounted with online 'discard'" in warning and "fstrim" in warning
    no_discard = MOUNTS.replace(",discard", "")
    assert online_discard_warning(Path("/var/lib/ordq"), no_discard) is None
    assert online_discard_warning(tmp_path, "") is None


def test_reads_this_machine_s_mounts(tmp_path: Path) -> None:
    """The real /proc/mounts parses, and the answer matches the options of tmp_path's mount."""
    found = mount_of(tmp_path.resolve(), Path("/proc/mounts").read_text())
    assert found is not None
    assert (online_discard_warning(tmp_path) is not None) == ("discard" in found[2])
