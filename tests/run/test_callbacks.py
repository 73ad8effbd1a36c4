"""poslab/run/callbacks.py: checkpoints written atomically (a write with no room leaves the old file
and no temporary)."""

from __future__ import annotations

import pytest
from conftest import file_size_limit

from poslab.errors import DiskFull
from poslab.run.callbacks import write_atomically


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


def test_callbacks_are_composed_from_config(corpus, tmp_path):
    """conf/callbacks/: one added with +callbacks.NAME, the console line dropped with null."""
    from conftest import train_in_process

    counted = tmp_path / "steps.txt"
    extra = [
        f"+callbacks.counter={{_target_:processes.StepCounter,path:'{counted}'}}",
        "callbacks.console=null",
        "eval.after_train=false",
        "trainer.max_steps=6",
        "trainer.log_every_n_steps=2",
    ]
    train_in_process("nope", corpus, tmp_path / "run", extra)
    assert counted.read_text() == "6"
    from poslab.run.training import configured_callbacks

    console = {"_target_": "poslab.run.console.ConsoleLine", "every": 2}
    assert configured_callbacks({"callbacks": {"console": None}}) == []
    assert [type(c).__name__ for c in configured_callbacks({"callbacks": {"c": console}})] == [
        "ConsoleLine"
    ]
    # a config written before conf/callbacks/ existed keeps its console line
    assert [type(c).__name__ for c in configured_callbacks({"trainer": {}})] == ["ConsoleLine"]
