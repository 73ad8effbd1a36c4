"""What a target id tells the loss, shared by the data that makes targets (tasks/) and the loss
that reads them (model/losses.py), so that neither imports the other."""

from __future__ import annotations

# a target the loss skips (PyTorch's cross_entropy default ignore_index): a task's prompt or
# padding under loss_on=answer
IGNORE_INDEX = -100
