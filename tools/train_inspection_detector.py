"""Train Lab 13's defect detector and write its weights (ptcourse/assets/inspection_detector.pt).

    python tools/train_inspection_detector.py

Trains ``models.detector_net()`` on the full inspection training split (128x128, each image
standardised) for 12 epochs with AdamW and a one-cycle schedule, random flips and transposes;
prints test accuracy and defect F1 per epoch, writes the weights and prints their sha256 (copy
it into ``models.DETECTOR_SHA256``). About 20 s on one core. Weights differ in their last bits
between CPUs, so they are committed rather than trained on each machine.
"""

from __future__ import annotations

import hashlib
import io
import time

import torch
import torch.nn.functional as F

from ptcourse.assets import datasets, models

EPOCHS, BATCH, LR = 12, 32, 3e-3


def augmented(x: torch.Tensor) -> torch.Tensor:
    for dims in ((3,), (2,)):
        if torch.rand(()) < 0.5:
            x = x.flip(dims)
    return x.transpose(2, 3) if torch.rand(()) < 0.5 else x


def defect_f1(predicted: torch.Tensor, truth: torch.Tensor) -> float:
    found, real = predicted > 0, truth > 0
    return 2 * (found & real).sum().item() / (found.sum().item() + real.sum().item())


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = datasets.inspection_tensors(128, "image", smoke=False)
    model = models.detector_net()
    opt = torch.optim.AdamW(model.parameters(), LR, weight_decay=1e-4)
    steps = EPOCHS * -(-len(x_train) // BATCH)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, LR, total_steps=steps)
    for epoch in range(EPOCHS):
        start = time.perf_counter()
        model.train()
        for batch in torch.randperm(len(x_train)).split(BATCH):
            logits = models.image_logits(model(augmented(x_train[batch])))
            loss = F.cross_entropy(logits, y_train[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
        model.eval()
        with torch.no_grad():
            predicted = models.image_logits(model(x_test)).argmax(1)
        accuracy = (predicted == y_test).float().mean().item()
        print(
            f"epoch {epoch + 1:2d}  {time.perf_counter() - start:4.1f} s  "
            f"test accuracy {accuracy:.3f}  defect F1 {defect_f1(predicted, y_test):.4f}"
        )
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    models.DETECTOR_WEIGHTS.write_bytes(buffer.getvalue())
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    print(f"wrote {models.DETECTOR_WEIGHTS}, sha256 {digest}")


if __name__ == "__main__":
    main()
