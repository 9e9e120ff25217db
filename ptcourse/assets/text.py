"""The headlines as model input: one tokenizer, one vocabulary, one encoder, random token ids.

Every lab that feeds ``headlines`` to a model encodes it here (:func:`encoded_headlines`), and
every lab that needs token ids without text draws them with :func:`random_tokens`.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ptcourse.assets import datasets
from ptcourse.core.smoke import is_smoke

_TOKEN = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


def tokenize(text: str) -> list[str]:
    """Lower-cased words, numbers and single punctuation marks."""
    return _TOKEN.findall(text.lower())


class Vocab:
    """Word <-> id table: 0 is padding, 1 is unknown, then words by falling frequency."""

    PAD, UNK = 0, 1

    def __init__(self, words: Iterable[str]) -> None:
        self.itos = ["<pad>", "<unk>", *words]
        self.stoi = {word: i for i, word in enumerate(self.itos)}

    @classmethod
    def build(cls, texts: Iterable[str], max_size: int | None = None) -> Vocab:
        """Vocabulary of ``texts``; ``max_size`` caps its length including <pad> and <unk>."""
        counts = Counter(token for text in texts for token in tokenize(text))
        words = sorted(counts, key=lambda w: (-counts[w], w))
        return cls(words if max_size is None else words[: max(max_size - 2, 0)])

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, length: int) -> list[int]:
        """Exactly ``length`` ids: truncated, or padded with 0 at the end."""
        ids = [self.stoi.get(token, self.UNK) for token in tokenize(text)][:length]
        return ids + [self.PAD] * (length - len(ids))

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` with the padding dropped."""
        return [self.itos[i] for i in ids if i != self.PAD]


def encode_batch(texts: Iterable[str], vocab: Vocab, length: int) -> torch.Tensor:
    """LongTensor of shape (len(texts), length) with the encoded texts."""
    return torch.tensor([vocab.encode(text, length) for text in texts], dtype=torch.long)


@dataclass(frozen=True)
class EncodedHeadlines:
    """The ``headlines`` train/test split as (N, length) token ids and (N,) class indices."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    vocab: Vocab

    @property
    def length(self) -> int:
        return self.x_train.shape[1]


@functools.cache
def _encoded(length: int, max_vocab: int | None, smoke: bool) -> EncodedHeadlines:
    (train, train_labels), (test, test_labels) = datasets.headline_splits(smoke)
    vocab = Vocab.build(train, max_size=max_vocab)
    return EncodedHeadlines(
        encode_batch(train, vocab, length),
        torch.tensor(train_labels),
        encode_batch(test, vocab, length),
        torch.tensor(test_labels),
        vocab,
    )


def encoded_headlines(
    length: int, max_vocab: int | None = None, smoke: bool | None = None
) -> EncodedHeadlines:
    """The split encoded to ``length`` tokens with a vocabulary of the training texts (capped at
    ``max_vocab``); smoke-size data in smoke mode. Built once per process and arguments."""
    return _encoded(length, max_vocab, is_smoke() if smoke is None else smoke)


def random_tokens(
    batch: int,
    length: int,
    vocab: int,
    *,
    min_length: int | None = None,
    lowest_id: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(batch, length) token ids in [lowest_id, vocab), each row padded with 0 after a random
    length in [min_length, length] (default: half the row): a padded batch of texts."""
    shortest = length // 2 if min_length is None else min_length
    tokens = torch.randint(lowest_id, vocab, (batch, length), generator=generator)
    keep = torch.randint(shortest, length + 1, (batch, 1), generator=generator)
    return tokens.masked_fill(torch.arange(length) >= keep, 0)
