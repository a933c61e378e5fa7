"""A tiny random BERT with a WordPiece vocabulary learned from the data: a real transformer that
builds offline in seconds, for tests and benchmarks where the model's quality does not matter."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def learn_wordpiece_vocab(texts: Iterable[str], vocab_size: int) -> dict[str, int]:
    """A WordPiece vocabulary learned from `texts`, numbered in a fixed order (the trainer's own
    numbering changes from one run to the next, which would change the model's embeddings)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS))
    tokenizer.train_from_iterator(texts, trainer)
    learned = sorted(set(tokenizer.get_vocab()) - set(SPECIAL_TOKENS))
    return {token: index for index, token in enumerate([*SPECIAL_TOKENS, *learned])}


def build_tiny_bert(
    texts: Iterable[str],
    destination: Path,
    *,
    vocab_size: int = 2000,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 2,
    dropout: float = 0.1,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised BERT and its tokenizer to `destination` (save_pretrained layout).
    With `dropout` 0, training draws no random numbers after the classifier head is made: runs of
    different shapes can then be compared weight for weight."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    vocab = learn_wordpiece_vocab(texts, vocab_size)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hidden_size * 2,
        max_position_embeddings=512,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(destination)
    BertTokenizer(vocab=vocab).save_pretrained(destination)
    return destination


def build_tiny_resnet(destination: Path, *, image_size: int = 32, seed: int = 0) -> Path:
    """Save a randomly initialised ResNet of about 80,000 parameters and its image processor (PIL,
    resizing to `image_size`, no torchvision needed) to `destination`: an image model that builds
    offline in a second. The classification head is replaced for each dataset's labels."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    config = ResNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32, 64], depths=[1, 1, 1], layer_type="basic"
    )
    torch.manual_seed(seed)
    ResNetForImageClassification(config).save_pretrained(destination)
    half = [0.5, 0.5, 0.5]
    processor = ViTImageProcessorPil(size={"height": image_size, "width": image_size}, image_mean=half, image_std=half)
    processor.save_pretrained(destination)
    return destination
