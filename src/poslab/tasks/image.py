"""Token grids from a local folder of images (`data=image data.task.path=DIR`), read through
`datasets`' imagefolder loader (DIR/train/*.png, DIR/test/*.png, or one flat folder, whose every
`holdout`-th image is held out).

An example of `length` tokens is one image resized to the largest s × s grid with s² + 1 ≤
length + 1 (box filter), each pixel quantised to a fixed palette of `levels`³ colours (levels
per RGB channel; a fixed palette, so a token means the same colour in every image), in raster
order after `<bos>`, with (row, column) positions as in data=grid. Every pixel is an answer
token: the model predicts the image pixel by pixel. Training draws training images; validation
and evaluation the held-out ones, at larger sizes for resolution extrapolation (so at 1× the
evaluation sees the images validation saw, at the same size).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.tasks.base import Example, Task
from poslab.tasks.grid import grid_example


def load_images(path: str | Path, holdout: int, cache_dir: str | None = None) -> dict[str, list]:
    """{"train": [...], "heldout": [...]} RGB PIL images of an imagefolder."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"data.task.path={path} is not a folder; point it at a folder of images")
    from datasets import load_dataset

    try:
        splits = load_dataset("imagefolder", data_dir=str(folder), cache_dir=cache_dir)
    except Exception as err:  # datasets' own message for a folder it cannot read
        raise ConfigError(f"data.task.path={path}: no images read ({err})") from None
    images = {name: [im.convert("RGB") for im in split["image"]] for name, split in splits.items()}
    heldout_name = next((n for n in ("test", "validation") if n in images), None)
    train = images.get("train", [])
    if heldout_name is None:  # one flat folder: hold out every `holdout`-th image
        train, heldout = [im for i, im in enumerate(train) if i % holdout], train[::holdout]
    else:
        heldout = images[heldout_name]
    if not train or not heldout:
        raise ConfigError(
            f"data.task.path={path} gives {len(train)} training and {len(heldout)} held-out "
            "images; it needs at least one of each (train/ and test/ subfolders, or ≥ 2 images)"
        )
    return {"train": train, "heldout": heldout}


class ImageGrid(Task):
    name = "image"
    position_axes = 2

    def __init__(
        self, path: str, levels: int = 2, holdout: int = 10, cache_dir: str | None = None
    ) -> None:
        super().__init__()
        require("data.task.levels", levels, integer(2, 6))  # refuses true/false too
        require("data.task.holdout", holdout, integer(2))
        self.levels = levels
        self.vocabulary(["<bos>"], [f"rgb{i}" for i in range(levels**3)])
        self.images = load_images(path, holdout, cache_dir)

    @staticmethod
    def side(length: int) -> int:
        return math.isqrt(length)

    def min_length(self) -> int:
        return 4

    def max_position(self, length: int) -> int:
        return self.side(length)

    def pixels(self, image: Any, side: int) -> np.ndarray:
        """(side, side) palette indices of an image resized with a box filter."""
        from PIL import Image

        rgb = np.asarray(image.resize((side, side), Image.Resampling.BOX), dtype=np.float64)
        q = np.clip((rgb / 256 * self.levels).astype(np.int64), 0, self.levels - 1)
        return (q[..., 0] * self.levels + q[..., 1]) * self.levels + q[..., 2]

    def example(
        self,
        length: int,
        rng: np.random.Generator,
        condition: dict | None = None,
        train: bool = False,
    ) -> Example:
        self.check_length(length)
        s = self.side(length)
        pool = self.images["train" if train else "heldout"]
        index = int(rng.integers(len(pool)))
        cells = self.pixels(pool[index], s) + 2
        return grid_example(length, self.ids["<bos>"], cells, np.ones((s, s), bool), {"side": s})

    def answer_symbols(self) -> list[int]:
        return list(range(2, 2 + self.levels**3))
