"""`python train.py pos=rope`: train a GPT with one positional scheme (poslab/apps/train.py;
installed, the same command is `poslab-train`)."""

from poslab.apps.train import entry

if __name__ == "__main__":
    entry()
