"""The worker: the one process that runs a submission's code, inside the sandbox.

It executes the notebook's cells one at a time in an IPython shell, as the judge sends them,
and then answers the judge's calls on the names they defined. Requests arrive pickled from the
judge (trusted, so unpickling them here is safe), large input tensors through the exchange file;
every reply is data in :mod:`ptcourse.judge.wire`'s format, which the judge reads without
running code: tensors, numbers, strings and containers of them. Anything else (a function, a
module, an iterator) stays here and travels as a reference, ``{"__ref__": id, "type": name}``,
that the judge can call.

Run as ``python -I -m ptcourse.judge.worker`` (isolated mode: the working folder is not on
``sys.path``, so a file submitted beside the notebook cannot shadow a module).
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import shutil
import signal
import struct
import sys
import traceback
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from ptcourse.judge import wire

HEADER = struct.Struct("<Q")
DATA = (torch.Tensor, int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.Size)
DICT_KEYS = (str, int, float, bool)  # exact types: a key's equality and hash are the built-in's
# numpy's own scalar types (np.int64 from an argmax, np.float64 from a mean) cross as the Python
# number they hold: their exact types, so a subclass with its own equality stays a reference.
NUMPY_SCALARS = frozenset(
    t
    for t in np.sctypeDict.values()
    if issubclass(t, np.number | np.bool_) and not issubclass(t, np.timedelta64)
)


def read_exactly(stream: BinaryIO, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(stream: BinaryIO) -> bytes:
    (size,) = HEADER.unpack(read_exactly(stream, HEADER.size))
    return read_exactly(stream, size)


def write_message(stream: BinaryIO, payload: bytes) -> None:
    stream.write(HEADER.pack(len(payload)) + payload)
    stream.flush()


def write_pieces(stream: BinaryIO, pieces: list[bytes | memoryview]) -> None:
    """One message made of several pieces (a reply's skeleton and its tensors' bytes)."""
    stream.write(HEADER.pack(sum(len(piece) for piece in pieces)))
    for piece in pieces:
        stream.write(piece)
    stream.flush()


class Objects:
    """What the judge holds references to, by id."""

    def __init__(self) -> None:
        self.by_id: dict[int, Any] = {}

    def keep(self, obj: Any) -> dict[str, Any]:
        self.by_id[id(obj)] = obj
        return {"__ref__": id(obj), "type": type(obj).__name__}

    def encode(self, obj: Any) -> Any:
        """Data as itself, containers of data recursively, everything else as a reference."""
        if isinstance(obj, torch.Tensor):  # a plain tensor, whatever subclass it was
            return obj.detach().as_subclass(torch.Tensor)
        if type(obj) in DATA:  # exact types: a subclass could redefine what equality means
            return obj
        if type(obj) in NUMPY_SCALARS:
            return obj.item()
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return type(obj)(self.encode(each) for each in obj)
        if type(obj) is dict and all(type(key) in DICT_KEYS for key in obj):
            return {key: self.encode(each) for key, each in obj.items()}
        return self.keep(obj)


EXCHANGE_ENV = "PTCOURSE_EXCHANGE"


class Exchange:
    """The file the judge writes large input tensors into while this process is frozen (shared
    memory: no copy through the pipe, and no memory of this sandbox's); a request refers to
    them by offset, and they are read here, without a copy, once the request has arrived."""

    def __init__(self, path: str | None) -> None:
        self.path, self.size, self.view = path, 0, None

    def tensor(self, offset: int, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
        import mmap

        size = os.path.getsize(self.path)
        if size != self.size:
            with open(self.path, "r+b") as f:
                self.view, self.size = mmap.mmap(f.fileno(), size), size
        kind = getattr(torch, dtype.removeprefix("torch."))
        count = int(np.prod(shape, dtype=np.int64))
        flat = torch.frombuffer(self.view, dtype=kind, count=count, offset=offset)
        return flat.view(shape)


class Requests(pickle.Unpickler):
    """The judge's pickles, with its references resolved to the objects kept here (and large
    input tensors to the :class:`Exchange`), and the course's own functions and classes (a
    check's harness, its diagnostics, a reference) taken from copies of ``ptcourse`` read from
    disk, not from the modules the notebook could patch."""

    def __init__(self, payload: bytes, objects: Objects, exchange: Exchange) -> None:
        super().__init__(io.BytesIO(payload))
        self.objects, self.exchange = objects, exchange

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and pid[0] == "exchange":
            return self.exchange.tensor(*pid[1:])
        return self.objects.by_id[pid]

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] == "ptcourse":
            return getattr(pristine(module), name)
        return super().find_class(module, name)


PRISTINE: dict[str, Any] = {}
_IMPORT = importlib.import_module  # bound before any notebook code runs


def pristine(name: str) -> Any:
    """Module ``name`` as its file on disk defines it, with the ``ptcourse`` modules it imports
    also fresh copies (made once per worker, before or after the notebook patched the loaded
    ones). It raises the bar, it is not a wall: the notebook can still patch torch itself."""
    if name not in PRISTINE:
        loaded = {key: sys.modules.pop(key) for key in list(sys.modules) if _ours(key)}
        sys.modules.update(PRISTINE)
        try:
            _IMPORT(name)
            PRISTINE.update({key: mod for key, mod in sys.modules.items() if _ours(key)})
        finally:
            for key in [key for key in sys.modules if _ours(key)]:
                del sys.modules[key]
            sys.modules.update(loaded)
    return PRISTINE[name]


def _ours(module: str) -> bool:
    return module.split(".")[0] == "ptcourse" and not module.startswith("ptcourse.judge")


def _shell() -> Any:
    from IPython.core.displayhook import DisplayHook
    from IPython.core.interactiveshell import InteractiveShell

    class QuietHook(DisplayHook):
        """Keeps the last expression's value (the cell's result) without printing it."""

        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: Any, md_dict: Any = None) -> None:
            pass

    class Shell(InteractiveShell):
        displayhook_class = QuietHook

        def _showtraceback(self, etype: Any, evalue: Any, stb: Any) -> None:
            pass  # the judge gets the traceback as an error output instead

    return Shell.instance()


def _outputs(captured: Any, result: Any, count: int) -> list[dict[str, Any]]:
    outputs: list[dict[str, Any]] = []
    for name, text in (("stdout", captured.stdout), ("stderr", captured.stderr)):
        if text:
            outputs.append({"output_type": "stream", "name": name, "text": text})
    for rich in captured.outputs:
        outputs.append({"output_type": "display_data", "data": rich.data, "metadata": {}})
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        outputs.append(
            {
                "output_type": "error",
                "ename": type(error).__name__,
                "evalue": str(error),
                "traceback": [line.rstrip("\n") for line in lines],
            }
        )
    elif result.result is not None:
        outputs.append(
            {
                "output_type": "execute_result",
                "data": {"text/plain": repr(result.result)},
                "metadata": {},
                "execution_count": count,
            }
        )
    return outputs


class Worker:
    def __init__(self) -> None:
        self.shell = _shell()
        self.objects = Objects()
        self.kept: Any = None

    def cell(self, source: str, count: int) -> dict[str, Any]:
        from IPython.utils.capture import capture_output

        with capture_output() as captured:
            result = self.shell.run_cell(source, store_history=True)
        return {"outputs": _outputs(captured, result, count)}

    def ping(self) -> bool:
        return True

    def lookup(self, name: str) -> Any:
        if name not in self.shell.user_ns:
            raise NameError(f"name {name!r} is not defined in the notebook")
        return self.objects.encode(self.shell.user_ns[name])

    def call(self, target: Any, args: tuple, kwargs: dict, give_back: bool) -> Any:
        value = target(*args, **kwargs)
        changed = [_state(arg) for arg in args] if give_back else None
        return {"value": self.objects.encode(value), "args": changed}

    def call_and_keep(self, target: Any, args: tuple, kwargs: dict, give_back: bool) -> Any:
        return {"value": self.objects.keep(target(*args, **kwargs)), "args": None}

    def keep_each(self, objs: list[Any]) -> list[Any]:
        return [self.objects.keep(obj) for obj in objs]

    def attribute(self, target: Any, name: str) -> Any:
        return self.objects.encode(getattr(target, name))

    def next(self, target: Any) -> Any:
        try:
            return {"value": self.objects.encode(next(target)), "done": False}
        except StopIteration:
            return {"value": None, "done": True}

    def run(self, target: Any, arg_sets: list[tuple], threads: int, inference: bool) -> list:
        """A timed block: ``target`` on each set of inputs, the outputs handed back (the judge's
        clock runs from sending the inputs to having the outputs)."""
        torch.set_num_threads(threads)
        with torch.inference_mode(inference):
            return [self.objects.encode(target(*args)) for args in arg_sets]

    def keep(self, target: Any, arg_sets: list[tuple], threads: int, inference: bool) -> None:
        """A memory-measured call: its output stays here until :meth:`result`."""
        torch.set_num_threads(threads)
        with torch.inference_mode(inference):
            self.kept = target(*arg_sets[0])

    def result(self) -> Any:
        value, self.kept = self.kept, None
        return self.objects.encode(value)

    def release_memory(self) -> None:
        """Collect garbage and give freed heap back to the system before a memory reading."""
        import gc

        from ptcourse.core import measure

        gc.collect()
        measure.rss_follows_tensors()


def _state(arg: Any) -> Any:
    """What a call may have changed in an argument the judge passed: a module's parameters,
    buffers and gradients, an optimizer's state (the judge copies them back into its objects)."""
    if isinstance(arg, torch.nn.Module):
        grads = {name: p.grad for name, p in arg.named_parameters() if p.grad is not None}
        return {"state": dict(arg.state_dict()), "grads": grads}
    if isinstance(arg, torch.optim.Optimizer):
        return {"optimizer": arg.state_dict()}
    if isinstance(arg, torch.Generator):
        return {"generator": arg.get_state()}
    return None


def _copy_submission() -> None:
    """The submission's files into the private scratch folder (the working directory)."""
    source = Path(os.environ["PTCOURSE_SUBMISSION"])  # set by the judge, sandboxed or not
    for path in source.iterdir() if source.is_dir() else ():
        target = Path.cwd() / path.name
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(path, target)
    for folder in ("HOME", "IPYTHONDIR", "TMPDIR", "MPLCONFIGDIR"):
        Path(os.environ[folder]).mkdir(parents=True, exist_ok=True)


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    worker = Worker()
    exchange = Exchange(os.environ.get(EXCHANGE_ENV))
    while True:
        try:
            payload = read_message(requests)
        except EOFError:
            return
        try:
            op, *args = Requests(payload, worker.objects, exchange).load()
            reply = {"ok": True, "value": getattr(worker, op)(*args)}
        except BaseException as error:  # noqa: BLE001 - every failure goes back to the judge
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
            reply = {"ok": False, "error": text[-2000:]}
        try:
            pieces = wire.dumps(reply)
        except Exception as error:  # noqa: BLE001 - an unsendable value is the student's bug
            pieces = wire.dumps({"ok": False, "error": f"cannot send the value back: {error}"})
        write_pieces(replies, pieces)


def main() -> None:
    # The channel to the judge moves off fds 0 and 1, so that anything the notebook prints at
    # the C level cannot corrupt it; fds 1 and 2 then go to the judge's log of this worker.
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    _copy_submission()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
    serve(requests, replies)


if __name__ == "__main__":
    main()
