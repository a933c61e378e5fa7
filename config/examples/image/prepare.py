"""Makes the image example's inputs in its working directory (scripts/run_example.sh calls it):
data/animal-mnist/<label>/*.png, the 10,000 silhouettes of the PyPI package animal-mnist, and
inputs/tiny-resnet/, a random ResNet of 80,000 parameters built offline. Both are kept once made."""

import sys
from pathlib import Path

from scratchflow.animal_mnist import write_pngs
from scratchflow.tiny_model import build_tiny_resnet

work = Path(sys.argv[1])
write_pngs(work / "data" / "animal-mnist")
if not (work / "inputs" / "tiny-resnet" / "config.json").is_file():
    build_tiny_resnet(work / "inputs" / "tiny-resnet")
