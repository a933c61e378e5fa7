"""image-classification: fine-tune a Hugging Face image model (AutoModelForImageClassification, with
its AutoImageProcessor; PIL only, no torchvision) on a folder per label of PNG or JPEG images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scratchflow.classification import (
    TRAINER_CHECKPOINT_MARKER,
    check_no_target_column,
    predict_test_split,
    splits_and_labels,
)
from scratchflow.dataset import DatasetError, LabelledFile, check_labelled, labelled_files
from scratchflow.tasks import PredictContext, Predicted, TrainContext, Trained

CHECKPOINT_MARKER = TRAINER_CHECKPOINT_MARKER
NEEDS_MODEL = True
METRICS = {"macro_f1": "max", "accuracy": "max"}
WRITES_PREDICTIONS = True
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def check_settings(config: dict[str, Any]) -> None:
    check_no_target_column(config)
    if config["dataset"]["format"] != "folder":
        raise ValueError(
            f"dataset.format: task image-classification reads a folder per label of images (format: folder), "
            f"not {config['dataset']['format']!r}"
        )


def check_data(dataset: dict[str, Any], sources: dict[str, Path]) -> None:
    """Every file is an image PIL can read, in a label folder; two labels or more; splits not empty."""
    from PIL import Image, UnidentifiedImageError

    found = {name: labelled_files(path) for name, path in sources.items()}
    for name, files in found.items():
        for file in files:
            if file.path.suffix.lower() not in IMAGE_SUFFIXES:
                raise DatasetError(f"{file.id} in {sources[name]} is not a PNG or JPEG file (by its name); remove it")
            try:
                with Image.open(file.path) as image:
                    image.verify()
            except (UnidentifiedImageError, OSError, SyntaxError) as error:
                raise DatasetError(f"{file.id} in {sources[name]} is not an image PIL can read: {error}") from None
    check_labelled(found, sources, dataset)


def check_model(model_dir: Path) -> None:
    from transformers import AutoConfig, AutoImageProcessor

    AutoConfig.from_pretrained(model_dir, local_files_only=True)
    AutoImageProcessor.from_pretrained(model_dir, local_files_only=True)


def load_image(file: LabelledFile) -> Any:
    from PIL import Image

    with Image.open(file.path) as image:
        return image.convert("RGB")


class ImageExamples:
    """Images read and processed as they are needed (a torch map-style dataset)."""

    def __init__(self, files: list[LabelledFile], processor: Any, label_ids: dict[str, int]):
        self.files, self.processor, self.label_ids = files, processor, label_ids

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        file = self.files[index]
        pixels = self.processor(load_image(file), return_tensors="pt")["pixel_values"][0]
        return {"pixel_values": pixels, "labels": self.label_ids[file.label]}


def train(context: TrainContext) -> Trained | None:
    from transformers import AutoImageProcessor, AutoModelForImageClassification, set_seed

    from scratchflow import hf_trainer

    splits, labels = splits_and_labels(context, labelled_files)
    label_ids = {label: index for index, label in enumerate(labels)}
    set_seed(context.params["seed"])  # before the model is built: the new classifier head is random
    processor = AutoImageProcessor.from_pretrained(context.model, local_files_only=True)
    model = AutoModelForImageClassification.from_pretrained(
        context.model,
        local_files_only=True,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id=label_ids,
        ignore_mismatched_sizes=True,  # a pretrained head for other labels is replaced
    )
    trainer, figures = hf_trainer.train(
        context,
        model=model,
        args=hf_trainer.training_arguments(
            context, has_validation=bool(splits["validation"]), remove_unused_columns=False
        ),
        train_dataset=ImageExamples(splits["train"], processor, label_ids),
        eval_dataset=ImageExamples(splits["validation"], processor, label_ids) if splits["validation"] else None,
        processing_class=processor,
    )
    if figures is None:
        return None  # stopped on request, its checkpoint saved
    trained = context.work_dir / "model"
    trainer.save_model(str(trained))
    return Trained(output=trained, metrics=figures)


def predict(context: PredictContext) -> Predicted:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    processor = AutoImageProcessor.from_pretrained(context.trained, local_files_only=True)
    model = AutoModelForImageClassification.from_pretrained(context.trained, local_files_only=True)

    def encode(batch: list[LabelledFile]) -> Any:
        return processor([load_image(file) for file in batch], return_tensors="pt")

    return predict_test_split(model, context, labelled_files, encode)
