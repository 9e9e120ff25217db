import pytest
import torch
import torch.nn.functional as F

from ptcourse.assets.models import (
    EncoderLayer,
    NaiveSelfAttention,
    SDPASelfAttention,
    TextClassifier,
    accuracy,
    count_parameters,
    image_classifier,
    naive_attention,
    tiny_cnn,
    train_steps,
)


def _tokens(b: int = 4, n: int = 16, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (b, n), generator=g)
    lengths = torch.tensor([n, n // 2, 3, 1])[:b]
    tokens[torch.arange(n) >= lengths[:, None]] = 0
    return tokens


def test_image_models_shapes():
    x = torch.randn(2, 3, 64, 64)
    assert image_classifier(num_classes=5).eval()(x).shape == (2, 5)
    assert tiny_cnn(num_classes=3, channels=8).eval()(x).shape == (2, 3)
    with pytest.raises(ValueError):
        image_classifier(width="resnet7")


def test_resnet18_parameter_count():
    # torchvision's resnet18 has 11,689,512 parameters with 1000 classes; a 4-class head has
    # 996 fewer output rows of 512 weights + 1 bias each.
    assert count_parameters(image_classifier(num_classes=4)) == 11_178_564


def test_count_parameters_trainable_only():
    m = torch.nn.Linear(3, 2)
    m.bias.requires_grad_(False)
    assert count_parameters(m) == 8
    assert count_parameters(m, trainable_only=True) == 6


def test_init_is_deterministic_under_seed():
    def state(build):
        torch.manual_seed(123)
        return build().state_dict()

    for build in (lambda: tiny_cnn(channels=8), lambda: TextClassifier(50, 3, d_model=32)):
        a, b = state(build), state(build)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_naive_attention_matches_sdpa_functional():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 10, 8).unbind(0)
    mask = torch.rand(2, 1, 10, 10) > 0.3
    mask[..., 0] = True  # no fully masked query
    for m in (None, mask):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        torch.testing.assert_close(naive_attention(q, k, v, m), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_mask", [False, True])
def test_naive_and_sdpa_modules_agree(with_mask):
    torch.manual_seed(0)
    naive = NaiveSelfAttention(32, 4)
    sdpa = SDPASelfAttention(32, 4)
    sdpa.load_state_dict(naive.state_dict())  # same layout, interchangeable
    x = torch.randn(4, 16, 32, requires_grad=True)
    pad = (_tokens() == 0) if with_mask else None
    out_n, out_s = naive(x, pad), sdpa(x, pad)
    torch.testing.assert_close(out_n, out_s, atol=1e-5, rtol=1e-5)
    (g_n,) = torch.autograd.grad(out_n.sum(), x)
    (g_s,) = torch.autograd.grad(out_s.sum(), x)
    torch.testing.assert_close(g_n, g_s, atol=1e-5, rtol=1e-5)


def test_encoder_layer_shapes_and_bad_attention():
    layer = EncoderLayer(32, 4, dropout=0.0, attention="naive")
    assert layer(torch.randn(2, 7, 32)).shape == (2, 7, 32)
    with pytest.raises(ValueError):
        EncoderLayer(32, 4, attention="flash")


def test_text_classifier_shapes_and_max_len():
    model = TextClassifier(50, 3, d_model=32, heads=4, layers=2, max_len=16)
    assert model(_tokens()).shape == (4, 3)
    with pytest.raises(ValueError):
        model(torch.ones(1, 17, dtype=torch.long))


def test_set_attention_keeps_outputs_and_parameters():
    torch.manual_seed(0)
    model = TextClassifier(50, 3, d_model=32, heads=4, max_len=16, attention="sdpa").eval()
    tokens = _tokens()
    params = list(model.parameters())
    before = model(tokens)
    assert model.set_attention("naive") is model
    assert model.attention == "naive"
    assert all(isinstance(layer.attn, NaiveSelfAttention) for layer in model.layers)
    assert not model.layers[0].attn.training  # eval mode carried over
    # the same Parameter objects, so an existing optimizer keeps training the swapped model
    assert all(a is b for a, b in zip(params, model.parameters(), strict=True))
    torch.testing.assert_close(model(tokens), before, atol=1e-5, rtol=1e-5)
    model.set_attention("sdpa")
    torch.testing.assert_close(model(tokens), before, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_text_classifier_ignores_padding(attention):
    torch.manual_seed(0)
    model = TextClassifier(50, 3, d_model=32, heads=4, max_len=32, attention=attention).eval()
    tokens = _tokens(n=16)
    padded = torch.cat([tokens, torch.zeros(4, 10, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded), model(tokens), atol=1e-5, rtol=1e-5)


def test_text_classifier_all_padding_row_is_finite():
    model = TextClassifier(50, 3, d_model=32, max_len=16, attention="naive").eval()
    tokens = _tokens()
    tokens[1] = 0
    assert torch.isfinite(model(tokens)).all()


def test_train_steps_learns_toy_problem_and_accuracy():
    torch.manual_seed(0)
    x = torch.randn(256, 2)
    y = (x[:, 0] > 0).long()
    batches = list(zip(x.split(64), y.split(64), strict=True))
    model = torch.nn.Linear(2, 2)
    losses = train_steps(model, batches, steps=40, lr=0.05)
    assert len(losses) == 40  # the 4-batch list is cycled
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4])
    assert accuracy(model, x, y, batch_size=100) > 0.95
    assert model.training  # accuracy restores the mode


def test_train_steps_stops_when_a_one_shot_iterator_runs_out():
    model = torch.nn.Linear(2, 2)
    batches = iter([(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]))] * 3)
    assert len(train_steps(model, batches, steps=10, optimizer="sgd")) == 3
    with pytest.raises(ValueError):
        train_steps(model, [], steps=1, optimizer="lbfgs")


def test_text_classifier_trains():
    torch.manual_seed(0)
    # class = whether token 1 appears in the sequence
    tokens = torch.randint(2, 30, (128, 12))
    y = torch.randint(0, 2, (128,))
    tokens[y == 1, 0] = 1
    tokens[:, 8:] = 0
    model = TextClassifier(30, 2, d_model=32, heads=2, layers=1, max_len=12, dropout=0.0)
    batches = list(zip(tokens.split(32), y.split(32), strict=True))
    losses = train_steps(model, batches, steps=40, lr=3e-3)
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4])
    assert accuracy(model, tokens, y) > 0.9
