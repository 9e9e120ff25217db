"""Lab 02 (NVIDIA DALI): a baseline-equivalent submission.

"baseline" pastes Lab 01's baseline into every exercise: ``tvio_batch`` decodes with PIL and
transforms one image at a time; the DALI graph runs the baseline's per-sample PIL decode and
torchvision transforms inside ``fn.python_function`` (the same work, wrapped in DALI); and
``dali_loader`` returns the PIL loader. Its outputs are right (it keeps the correctness tests),
but it must score 0 on the speed check. No looper: the ungraded measurement cells of sections
4 and 5 call every exercise, so a looping one would time out several cells.
"""

PER_SAMPLE_TVIO = '''
def tvio_batch(paths, size=SIZE):
    """Baseline-equivalent: PIL decode and the torchvision reference, one image at a time."""
    return lab.reference_batch(paths)
'''

PIL_IN_DALI = '''
import io

import numpy as np
from PIL import Image


@pipeline_def
def inspection_pipeline(paths, labels, size, train, shuffle, gpu):
    """Baseline-equivalent: Lab 01's per-sample PIL decode and transforms, inside DALI."""
    jpegs, label = fn.readers.file(
        files=paths, labels=labels, random_shuffle=shuffle, name="reader"
    )
    transform = loaders.baseline_transform() if train else lab.eval_transform()

    def pil(encoded):
        with Image.open(io.BytesIO(np.asarray(encoded).tobytes())) as image:
            return transform(image.convert("RGB")).numpy()

    return fn.python_function(jpegs, function=pil, batch_processing=False), label
'''

PIL_LOADER = '''
def dali_loader(files, batch_size, size=SIZE, train=True, shuffle=True, seed=0, device_id=None):
    """Baseline-equivalent: Lab 01's PIL loader."""
    yield from lab.pil_loader(files, batch_size, train=train, shuffle=shuffle)
'''

VARIANT = {
    "students": {
        "baseline": {
            "tvio_batch": PER_SAMPLE_TVIO,
            "inspection_pipeline": PIL_IN_DALI,
            "dali_loader": PIL_LOADER,
        },
    },
    "speed_checks": ["test_speed"],
    "loop_checks": [],
}
