import torch

from ptcourse.assets import text


def test_random_tokens_pad_the_end_of_each_row_within_range():
    x = text.random_tokens(
        64, 16, 50, min_length=6, lowest_id=2, generator=torch.Generator().manual_seed(0)
    )
    assert x.shape == (64, 16)
    lengths = (x != 0).sum(1)
    assert (lengths >= 6).all() and (lengths <= 16).all()
    for row, n in zip(x, lengths, strict=True):
        assert (row[:n] >= 2).all() and (row[:n] < 50).all() and (row[n:] == 0).all()
    default = text.random_tokens(64, 16, 50, generator=torch.Generator().manual_seed(0))
    assert ((default != 0).sum(1) >= 8).all()


def test_encoded_headlines_is_one_cached_encoding(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    split = text.encoded_headlines(12, max_vocab=500)
    assert split is text.encoded_headlines(12, max_vocab=500)
    assert split.x_train.shape[1] == split.length == 12 and len(split.vocab) <= 500
    assert split.x_train.dtype == torch.long and len(split.x_train) == len(split.y_train)
    assert int(split.x_train.max()) < len(split.vocab)
