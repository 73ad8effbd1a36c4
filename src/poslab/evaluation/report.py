"""Extrapolation results as tables, figures and files, by concern:

* poslab.evaluation.tables: Markdown tables and the row statuses they show;
* poslab.evaluation.figures: the plots;
* poslab.evaluation.files: the JSON/CSV/Markdown/PNG set written all or none, where an
  evaluation's files go, and their W&B copy.

This module gathers the names other code reads from one place.
"""

from __future__ import annotations

from poslab.evaluation.figures import (
    accuracy_figure,
    heatmap_figure,
    line_styles,
    log_binned,
    position_figure,
    ppl_figure,
    ppl_yaxis,
)
from poslab.evaluation.files import (
    CSV_FIELDS,
    load_rows,
    no_room_error,
    plot_loss_vs_position,
    plot_ppl_vs_length,
    temporary_path,
    write_all_or_none,
    write_reports,
)
from poslab.evaluation.tables import (
    NONFINITE,
    fmt,
    is_finite,
    is_nonfinite,
    markdown,
    markdown_table,
    metric_name,
)

__all__ = [
    "CSV_FIELDS",
    "NONFINITE",
    "accuracy_figure",
    "fmt",
    "heatmap_figure",
    "is_finite",
    "is_nonfinite",
    "line_styles",
    "load_rows",
    "log_binned",
    "markdown",
    "markdown_table",
    "metric_name",
    "no_room_error",
    "plot_loss_vs_position",
    "plot_ppl_vs_length",
    "position_figure",
    "ppl_figure",
    "ppl_yaxis",
    "temporary_path",
    "write_all_or_none",
    "write_reports",
]
