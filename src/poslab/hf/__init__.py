"""Hugging Face: pretrained causal LMs scored as poslab checkpoints are (pretrained.py, with
the attention hook of pretrained_attention.py), poslab runs exported as HF models (export.py),
and tiny HF models with float64 references to check both (tiny_hf.py)."""
