"""The training step of benchmarks/hand_written_job.sh: a bare Trainer on the extracted data, with
the same model, split and settings as scratchflow's train job; writes the seconds it trained
(from after the imports, the span scratchflow's record calls 'train').

    python hand_written_train.py SCRATCH MODEL OUTPUT SECONDS_FILE
"""

import sys
import time
from pathlib import Path

import measure  # noqa: F401 (puts scratchflow on the path)
from lifecycle import SPLIT, TRAINING
from scratchflow.dataset import label_names, load_examples, split_examples
from throughput import bare_trainer

scratch, model, output, seconds_file = map(Path, sys.argv[1:])
(data,) = [path for path in scratch.iterdir() if path.is_dir()]
examples = load_examples(data, "folder", "text", "label")
splits = split_examples(examples, **SPLIT)
started = time.perf_counter()
bare_trainer(splits, label_names(examples), model, TRAINING, scratch / "trainer", save_to=output)
seconds_file.parent.mkdir(parents=True, exist_ok=True)
seconds_file.write_text(f"{time.perf_counter() - started}\n")
