"""poslab: positional encodings and length extrapolation for small GPT-style language models."""

__version__ = "0.1.0"
