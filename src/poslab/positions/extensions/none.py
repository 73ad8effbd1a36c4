"""`none`: the trained frequencies, as trained (log-n may still be on)."""

from __future__ import annotations

from typing import ClassVar

from poslab.positions.extensions.base import Extension


class NoExtension(Extension):
    named: ClassVar[bool] = False
    uses_factor: ClassVar[bool] = False

    def is_identity(self) -> bool:
        return True
