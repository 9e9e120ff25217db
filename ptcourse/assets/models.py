"""Small reference models the labs share: image classifiers, attention, a text classifier.

Everything is randomly initialised and deterministic under ``torch.manual_seed``, except the
inspection detector of Lab 13, whose trained weights are committed next to this file (made by
``tools/train_inspection_detector.py``, checked by sha256); no weights are ever downloaded.
The transformer is written with plain ``nn.Linear`` layers rather than ``nn.TransformerEncoder``
so that export and quantization tools see ordinary modules.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ATTENTION_KINDS = ("naive", "sdpa")


def image_classifier(num_classes: int = 4, width: str = "resnet18") -> nn.Module:
    """A torchvision ResNet (``resnet18``, ``resnet34`` or ``resnet50``), randomly initialised."""
    import torchvision  # here, not at the top: it costs seconds that text-only labs need not pay

    builders = {
        "resnet18": torchvision.models.resnet18,
        "resnet34": torchvision.models.resnet34,
        "resnet50": torchvision.models.resnet50,
    }
    if width not in builders:
        raise ValueError(f"width must be one of {sorted(builders)}, got {width!r}")
    return builders[width](weights=None, num_classes=num_classes)


def _conv_bn_relu(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


def tiny_cnn(num_classes: int = 4, channels: int = 32) -> nn.Module:
    """Four conv-bn-relu blocks (stride 2 from the second on) + global average pool + linear.

    Takes (B, 3, H, W) images of any size; trains in seconds on 64x64..128x128 inputs.
    """
    c = channels
    return nn.Sequential(
        _conv_bn_relu(3, c, 2),
        _conv_bn_relu(c, c, 1),
        _conv_bn_relu(c, 2 * c, 2),
        _conv_bn_relu(2 * c, 4 * c, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * c, num_classes),
    )


DETECTOR_WEIGHTS = Path(__file__).with_name("inspection_detector.pt")
DETECTOR_SHA256 = "a3e89c485d371bbd4b423df3c3d5b690c267e33058db3b75bb8377f709253bb1"


def detector_net() -> nn.Module:
    """Lab 13's defect detector, untrained: four conv-BN-ReLU layers (stride 8 in all) and a 1x1
    conv to 4 class maps, fully convolutional: a 128x128 image gives (4, 16, 16) maps."""
    return nn.Sequential(
        _conv_bn_relu(3, 16, 2),
        _conv_bn_relu(16, 32, 2),
        _conv_bn_relu(32, 48, 2),
        _conv_bn_relu(48, 64, 1),
        nn.Conv2d(64, 4, 1),
    )


def image_logits(maps: Tensor) -> Tensor:
    """(B, 4, H, W) class maps → (B, 4) image logits: a soft maximum over positions (a defect
    anywhere makes the image defective)."""
    return torch.logsumexp(maps.flatten(2) * 4.0, dim=2) / 4.0


def inspection_detector() -> nn.Module:
    """The trained detector in eval mode, from the committed weights (sha256-checked)."""
    data = DETECTOR_WEIGHTS.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != DETECTOR_SHA256:
        raise RuntimeError(
            f"{DETECTOR_WEIGHTS} has sha256 {digest[:12]}…, expected {DETECTOR_SHA256[:12]}…: "
            "restore it with `git checkout -- ptcourse/assets/inspection_detector.pt` or "
            "rebuild it with `python tools/train_inspection_detector.py`"
        )
    model = detector_net()
    model.load_state_dict(torch.load(DETECTOR_WEIGHTS, weights_only=True))
    return model.eval()


def naive_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """``softmax(q k^T / sqrt(D)) v`` with the (B, H, L, L) score matrix materialised.

    Shapes (B, H, L, D). ``mask`` follows ``F.scaled_dot_product_attention``: a boolean mask
    broadcastable to (B, H, L, L) with True = may attend, or a float mask added to the scores.
    A query whose keys are all masked gives NaN here (SDPA gives zeros).
    """
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    return scores.softmax(dim=-1) @ v


class SelfAttention(nn.Module):
    """Multi-head self-attention parameters: one fused ``qkv`` projection and an output ``proj``.

    Subclasses differ only in how they compute attention, so their state_dicts are
    interchangeable.
    """

    kind = ""

    def __init__(self, d_model: int, heads: int, bias: bool = True) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """x: (B, L, d_model). key_padding_mask: (B, L) bool, True marks padding to ignore."""
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        out = self._attend(q, k, v, mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))

    @classmethod
    def sharing(cls, other: SelfAttention) -> SelfAttention:
        """A ``cls`` that shares (not copies) ``other``'s layers, so optimizers keep working."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)  # bypass __init__: no new weights, no RNG draws
        new.heads, new.qkv, new.proj = other.heads, other.qkv, other.proj
        new.train(other.training)
        return new

    def extra_repr(self) -> str:
        return f"heads={self.heads}"


class NaiveSelfAttention(SelfAttention):
    """Self-attention that materialises the full attention matrix (memory grows as L^2)."""

    kind = "naive"

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return naive_attention(q, k, v, mask)


class SDPASelfAttention(SelfAttention):
    """Self-attention through ``F.scaled_dot_product_attention`` (fused/flash kernels)."""

    kind = "sdpa"

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _attention_class(kind: str) -> type[SelfAttention]:
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {kind!r}")
    return NaiveSelfAttention if kind == "naive" else SDPASelfAttention


class EncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer: x + attn(ln(x)), then x + mlp(ln(x)).

    Dropout is applied to each residual branch (not to the attention probabilities), so the
    naive and SDPA variants compute the same function in training mode too.
    """

    def __init__(
        self,
        d_model: int = 128,
        heads: int = 4,
        mlp_ratio: int = 4,
        dropout: float = 0.1,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = _attention_class(attention)(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(),
            nn.Linear(mlp_ratio * d_model, d_model),
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), key_padding_mask))
        return x + self.dropout(self.mlp(self.norm2(x)))

    def set_attention(self, kind: str) -> None:
        """Swap the attention implementation, keeping (sharing) its weights."""
        self.attn = _attention_class(kind).sharing(self.attn)


class TextClassifier(nn.Module):
    """Token + learned position embeddings, N pre-norm encoder layers, masked mean pool, linear.

    ``forward(tokens)`` takes a (B, L) LongTensor with L <= max_len; token id 0 is padding and
    is ignored by attention and pooling.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        d_model: int = 128,
        heads: int = 4,
        layers: int = 2,
        max_len: int = 64,
        attention: str = "sdpa",
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.tok = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.pos = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, heads, dropout=dropout, attention=attention)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    @property
    def attention(self) -> str:
        """The attention implementation in use: "naive" or "sdpa"."""
        return self.layers[0].attn.kind if len(self.layers) else ""

    def set_attention(self, kind: str) -> TextClassifier:
        """Swap every layer's attention implementation in place, keeping weights; returns self."""
        for layer in self.layers:
            layer.set_attention(kind)
        return self

    def forward(self, tokens: Tensor) -> Tensor:
        n = tokens.shape[1]
        if n > self.max_len:
            raise ValueError(f"sequence length {n} exceeds max_len={self.max_len}")
        pad = tokens == 0
        # An all-padding row would leave its queries nothing to attend to (NaN in the naive
        # path); let such rows attend everywhere. Their pooled output is zero anyway.
        key_pad = pad & ~pad.all(dim=1, keepdim=True)
        x = self.dropout(self.tok(tokens) + self.pos.weight[:n])
        for layer in self.layers:
            x = layer(x, key_pad)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        pooled = (self.norm(x) * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (shared ones counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def train_steps(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    steps: int,
    lr: float = 1e-3,
    optimizer: str = "adamw",
) -> list[float]:
    """Plain fp32 training with cross-entropy for ``steps`` steps; returns the loss of each.

    ``batches`` yields (x, y). A re-iterable (list, DataLoader) is cycled until ``steps`` is
    reached; a one-shot iterator stops training when it runs out.
    """
    optimizers = {
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=lr),
        "adam": lambda ps: torch.optim.Adam(ps, lr=lr),
        "sgd": lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.9),
    }
    if optimizer not in optimizers:
        raise ValueError(f"optimizer must be one of {sorted(optimizers)}, got {optimizer!r}")
    opt = optimizers[optimizer](model.parameters())
    device = _model_device(model)
    model.train()
    losses: list[float] = []
    while len(losses) < steps:
        before = len(losses)
        for x, y in batches:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        if len(losses) == before:  # empty, or a one-shot iterator that is used up
            break
    return losses


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 256) -> float:
    """Fraction of ``x`` classified as ``y``, in eval mode (the previous mode is restored)."""
    was_training = model.training
    model.eval()
    device = _model_device(model)
    correct = 0
    try:
        for i in range(0, len(x), batch_size):
            pred = model(x[i : i + batch_size].to(device)).argmax(dim=1)
            correct += (pred.cpu() == y[i : i + batch_size].cpu()).sum().item()
    finally:
        model.train(was_training)
    return correct / max(len(x), 1)
