"""`python eval.py run=RUN`: perplexity and tasks beyond the training length
(poslab/apps/evaluate.py; installed, the same command is `poslab-eval`)."""

from poslab.apps.evaluate import entry

if __name__ == "__main__":
    entry()
