"""The divergence guard: a run whose numbers stop being finite ends with one line and exit
status 3 (errors.Diverged) before anything of its epoch is logged or saved.

It watches what the loop reads anyway, and what the epoch would save:
- the reduced training loss, at every --log-interval and at the end of the epoch
  (`check_training_loss`, called by utils.train_epoch; no added sync);
- the reduced test loss of the epoch's evaluation, and the weights the epoch ends with, every
  parameter and buffer, in one reduction per epoch (`check_epoch`, called by every trainer's
  loop between evaluating and saving).
The second matters when the training loss still looked finite: one step of a huge LR can end
an epoch with weights that evaluate to nan, and a checkpoint of them diverges on every resume.
Every rank reads the same reduced values, so every rank stops alike, in the same place.
"""
import math

import torch

from training.base.errors import Diverged

FIX = ("nothing of this epoch was saved. Continue from the last checkpoint with a smaller LR "
       "(--resume --lr ...), or start again with a smaller --lr, a longer --warmup-epochs or "
       "fewer processes")


def check_training_loss(loss, epoch, lr, step, steps):
    """Stop (Diverged) when the mean training loss over the steps so far, reduced over the
    ranks, is not finite. Only the loss counts: steps that an fp16 GradScaler skips for inf
    gradients are its normal work."""
    if math.isfinite(loss):
        return
    where = f"epoch {epoch + 1}" if step == steps else f"epoch {epoch + 1} (step {step} of {steps})"
    raise Diverged(f"training diverged in {where}: the training loss became {loss} at LR {lr:.4g}; "
                   f"{FIX}")


@torch.no_grad()
def check_epoch(model, train, test, epoch, world):
    """Stop (Diverged) when the epoch's reduced test loss is not finite, or the weights it ends
    with are not: the largest magnitude of every floating-point parameter and buffer, reduced
    over the ranks in one sum, so that every rank decides alike. Called after the evaluation,
    before the epoch's metrics row and checkpoints are written."""
    tensors = [t for t in (*model.parameters(), *model.buffers())
               if t.is_floating_point() and t.numel()]
    largest = torch.stack([t.detach().abs().amax().float() for t in tensors]).amax()
    largest = world.allreduce(largest.reshape(1).double()).item()
    if not math.isfinite(test["loss"]):
        what = f"the test loss became {test['loss']}"
    elif not math.isfinite(largest):
        what = "the weights became non-finite"
    else:
        return
    raise Diverged(f"training diverged in epoch {epoch + 1}: {what} at LR {train['lr']:.4g}; {FIX}")
