"""The worker's replies on the wire: data only, read by the judge without running any code.

A reply is a JSON skeleton and the raw bytes of its tensors. The skeleton holds None, bools,
numbers, strings and tagged nodes: ``{"l": [...]}`` a list, ``{"t": [...]}`` a tuple,
``{"d": [[key, value], ...]}`` a dict, ``{"b": base64}`` bytes, ``{"c": [re, im]}`` a complex,
``{"y": name}`` a dtype, ``{"s": [...]}`` a ``torch.Size``, ``{"x": [offset, dtype, shape]}`` a
dense tensor whose bytes start at ``offset`` after the skeleton, ``{"p": [indices, values,
shape]}`` a sparse COO tensor. Anything else is refused. (``torch.save`` did the same job safely
with ``torch.load(weights_only=True)``, but at 4-6 ms for 64 small tensors: inside the judge's
clock that halved Lab 11's batched speedup.)
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import torch

DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
              torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.bool)
}  # fmt: skip
_LENGTH = struct.Struct("<Q")
ALIGN = 64


def dumps(value: Any) -> list[bytes | memoryview]:
    """``value`` (data and containers of data) as the pieces of one message."""
    buffers: list[memoryview] = []
    offset = [0]

    def tensor(t: torch.Tensor) -> list[Any]:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        start = offset[0]
        buffers.append(memoryview(raw))
        pad = (-raw.nbytes) % ALIGN
        if pad:
            buffers.append(memoryview(bytes(pad)))
        offset[0] = start + raw.nbytes + pad
        return [start, str(t.dtype).removeprefix("torch."), list(t.shape)]

    def node(v: Any) -> Any:
        if v is None or isinstance(v, bool | int | str) or type(v) is float:
            return v
        if isinstance(v, torch.Tensor):
            if v.layout == torch.sparse_coo:
                v = v.coalesce()
                return {"p": [node(v.indices()), node(v.values()), list(v.shape)]}
            return {"x": tensor(v)}
        if isinstance(v, torch.Size):
            return {"s": list(v)}
        if isinstance(v, list):
            return {"l": [node(e) for e in v]}
        if isinstance(v, tuple):
            return {"t": [node(e) for e in v]}
        if isinstance(v, dict):
            return {"d": [[node(k), node(e)] for k, e in v.items()]}
        if isinstance(v, bytes):
            return {"b": base64.b64encode(v).decode("ascii")}
        if isinstance(v, complex):
            return {"c": [v.real, v.imag]}
        if isinstance(v, torch.dtype):
            return {"y": str(v).removeprefix("torch.")}
        raise TypeError(f"cannot send {type(v).__name__} as data")

    skeleton = json.dumps(node(value)).encode()
    pad = (-(_LENGTH.size + len(skeleton))) % ALIGN
    head = _LENGTH.pack(len(skeleton) + pad) + skeleton + b" " * pad
    return [head, *buffers]


def loads(payload: bytearray) -> Any:
    """The value :func:`dumps` sent; ValueError on anything that is not that format."""
    (size,) = _LENGTH.unpack_from(payload, 0)
    base = _LENGTH.size + size
    skeleton = json.loads(bytes(payload[_LENGTH.size : base]))
    view = memoryview(payload)[base:]

    def tensor(spec: Any) -> torch.Tensor:
        start, dtype, shape = spec
        kind = DTYPES[dtype]
        numel = 1
        for n in shape:
            if not isinstance(n, int) or n < 0:
                raise ValueError("a bad shape")
            numel *= n
        width = torch.empty((), dtype=kind).element_size()
        if not isinstance(start, int) or start < 0 or start + numel * width > len(view):
            raise ValueError("a tensor outside the reply")
        if numel == 0:
            return torch.empty(shape, dtype=kind)
        return torch.frombuffer(view, dtype=kind, count=numel, offset=start).view(shape)

    def node(v: Any) -> Any:
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if not isinstance(v, dict) or len(v) != 1:
            raise ValueError("not a reply's node")
        ((tag, body),) = v.items()
        if tag == "x":
            return tensor(body)
        if tag == "p":
            indices, values, shape = body
            return torch.sparse_coo_tensor(node(indices), node(values), shape).coalesce()
        if tag == "l":
            return [node(e) for e in body]
        if tag == "t":
            return tuple(node(e) for e in body)
        if tag == "d":
            return {node(k): node(e) for k, e in body}
        if tag == "s":
            return torch.Size([int(n) for n in body])
        if tag == "b":
            return base64.b64decode(body)
        if tag == "c":
            return complex(*body)
        if tag == "y":
            return DTYPES[body]
        raise ValueError(f"unknown node {tag!r}")

    return node(skeleton)
