"""Fine-tune a text classifier on a CSV of `text,label` rows with the Hugging Face Trainer: a lab's
script of the usual shape (the DFKI cluster guide's example lab), written to be run by hand with
`srun python train.py --data ... --model ...`, and not for scratchflow (tests/test_trainer_script.py
runs it unchanged through scratchflow.trainer_script, and changed by a few lines through its helpers)."""

import argparse

import numpy as np
import pandas as pd
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    set_seed,
)

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="data/news.csv")
parser.add_argument("--model", default="distilbert-base-uncased")
parser.add_argument("--max-length", type=int, default=64)
args = parser.parse_args()

set_seed(42)
frame = pd.read_csv(args.data)
names = sorted(frame["label"].unique())
frame["label"] = frame["label"].map({name: number for number, name in enumerate(names)})
shuffled = frame.sample(frac=1.0, random_state=42)
held_out = len(frame) // 5
test, train = shuffled.iloc[:held_out], shuffled.iloc[held_out:]

tokenizer = AutoTokenizer.from_pretrained(args.model)


def encode(rows):
    encoded = tokenizer(list(rows["text"]), truncation=True, max_length=args.max_length)
    return [
        {"input_ids": ids, "attention_mask": mask, "labels": label}
        for ids, mask, label in zip(encoded["input_ids"], encoded["attention_mask"], rows["label"], strict=True)
    ]


def accuracy(prediction):
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=len(names))
training_args = TrainingArguments(
    output_dir="out",
    eval_strategy="epoch",
    save_strategy="epoch",
    learning_rate=1e-3,
    per_device_train_batch_size=16,
    num_train_epochs=4,
    seed=42,
    report_to="none",
)
trainer = Trainer(
    model=model,
    args=training_args,
    train_dataset=encode(train),
    eval_dataset=encode(test),
    data_collator=DataCollatorWithPadding(tokenizer),
    compute_metrics=accuracy,
)
trainer.train()
trainer.save_model("final_model")
print(trainer.evaluate())
print(trainer.predict(encode(test)).metrics)
