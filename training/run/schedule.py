"""The learning rate as a pure function of the (fractional) epoch: `LRSchedule`, which the
engine (utils.make_schedule) builds from the flags and a checkpoint's start, and applies
before every step. Its state is where the schedule started and from what LR, all a resume
needs."""
import math


class LRSchedule:
    """From base_lr at start_epoch to 0 at epochs, times `scale` (the world size under
    Horovod), with an optional per-batch linear warm-up from base_lr to base_lr * scale
    (Goyal et al.). `shape` cosine: stepped per epoch as in pytorch-cifar; onecycle: per
    batch, linearly from 0 to base_lr over the first `peak` of the span (a fraction), then
    linearly to 0 (the triangle of short CIFAR-10 schedules).

    It is a pure function of the (fractional) epoch; its state is just where
    the schedule started and from what, which is all a resume needs.
    """

    def __init__(self, base_lr, start_epoch, epochs, scale=1.0, warmup_epochs=0.0, shape="cosine",
                 peak=None):
        if shape == "onecycle" and not (peak and 0 < peak < 1):
            raise ValueError(f"a one-cycle schedule needs its peak, a fraction (got {peak})")
        self.base_lr, self.start_epoch, self.epochs = base_lr, start_epoch, epochs
        self.scale, self.warmup_epochs, self.shape, self.peak = scale, warmup_epochs, shape, peak

    def state_dict(self):
        return {"base_lr": self.base_lr, "start_epoch": self.start_epoch}

    def load_state_dict(self, state):
        self.base_lr, self.start_epoch = state["base_lr"], state["start_epoch"]

    def __call__(self, epoch):
        span = max(self.epochs - self.start_epoch, 1)
        if self.shape == "onecycle":
            done, peak = (epoch - self.start_epoch) / span, self.peak
            factor = max(done / peak if done < peak else (1 - done) / (1 - peak), 0.0)
        else:
            factor = 0.5 * (1 + math.cos(math.pi * (math.floor(epoch) - self.start_epoch) / span))
        lr = self.base_lr * self.scale * factor
        if epoch < self.warmup_epochs and self.scale != 1:
            lr *= (epoch * (self.scale - 1) / self.warmup_epochs + 1) / self.scale
        return lr

    def apply(self, optimizer, epoch):
        lr = self(epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
