"""Reporting: what scored rows become. Tables, figures, the run folder's files, the comparison of
runs with intervals over seeds, the paired differences, the sweep callback and replot. No module
here imports torch: a report is re-made from files on a laptop without a model."""
