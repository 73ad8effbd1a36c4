"""Text from a poslab run's checkpoint: `python scripts/generate.py run=RUN prompt="..."` (the
same command as `poslab-generate`; the code is poslab/apps/generate.py)."""

from poslab.apps.generate import main

if __name__ == "__main__":
    main()
