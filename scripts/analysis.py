"""Analysis plots: RoPE's decay bound and wavelengths, sinusoidal similarity, and the attention
of trained checkpoints (mean distance, mass beyond the training length), each as PNG + CSV.

python scripts/analysis.py all --out docs/results/analysis          # decay, wavelength, sinusoidal
python scripts/analysis.py decay --bases 100 10000 500000 --head-dims 64 128
python scripts/analysis.py wavelength --train-length 512
python scripts/analysis.py attention RUN_OR_CKPT ... --factor 4 --windows 4

Bad input (an unknown analysis, a missing checkpoint, the checkpoint of a generated task for
`attention`, an --out that cannot be written) ends with one `error: ...` line on stderr and exit
code 2, before any model runs; the output folder is made only once there is something to write.
See the poslab.analysis package (src/poslab/analysis/) for what each analysis computes.
"""

from poslab.analysis.cli import main

if __name__ == "__main__":
    main()
