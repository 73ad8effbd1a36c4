"""The model floor: the GPT (gpt.py), its attention kernels (attention.py, linear_attention.py),
its losses and precision, and building it from a config or a checkpoint (build.py)."""
