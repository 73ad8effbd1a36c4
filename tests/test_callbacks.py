"""poslab/callbacks.py: checkpoints written atomically (a write with no room leaves the old file
and no temporary)."""

from __future__ import annotations

import pytest
from conftest import file_size_limit

from poslab.callbacks import write_atomically
from poslab.errors import DiskFull


def test_a_write_with_no_room_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"the last good checkpoint")
    # a real "no room": writes past 50 kB fail with EFBIG (file_size_limit)
    with file_size_limit(50_000), pytest.raises(DiskFull) as err:
        write_atomically(target, b"x" * 100_000)
    assert str(err.value).startswith(f"no room to write {target} (0.1 MiB needed")
    assert target.read_bytes() == b"the last good checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    # and with room, the same call replaces the file
    write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    assert issubclass(DiskFull, ValueError)  # a ConfigError: one line, exit code 2
