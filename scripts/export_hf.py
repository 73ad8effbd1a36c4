"""A poslab run as a Hugging Face model: `python scripts/export_hf.py RUN --out DIR` (the same
command as `poslab-export`; the code is poslab/hf/export.py)."""

from poslab.hf.export import main

if __name__ == "__main__":
    main()
