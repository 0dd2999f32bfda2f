"""EfficientNet-B0 for 32x32 CIFAR images.

Reference:
    Mingxing Tan, Quoc V. Le.
    "EfficientNet: Rethinking Model Scaling for Convolutional Neural Networks". 2019.
    arXiv:1905.11946

MBConv blocks (expand, depthwise, squeeze-excitation, project) with swish
activations and the B0 stage table. CIFAR variant (as in kuangliu/pytorch-cifar):
the stem has stride 1, so four stride-2 stages take 32x32 to 2x2.
"""
import torch
from torch import nn
import torch.nn.functional as F


def swish(x):
    return x * torch.sigmoid(x)


def drop_connect(x, drop_rate):
    """Drop the whole residual branch per sample (stochastic depth), rescaled."""
    keep = 1.0 - drop_rate
    mask = torch.empty(x.shape[0], 1, 1, 1, dtype=x.dtype, device=x.device).bernoulli_(keep)
    return x / keep * mask


class SE(nn.Module):
    """Squeeze-and-excitation gate with swish, as in the EfficientNet paper."""

    def __init__(self, in_channels, se_channels):
        super().__init__()
        self.se1 = nn.Conv2d(in_channels, se_channels, kernel_size=1, bias=True)
        self.se2 = nn.Conv2d(se_channels, in_channels, kernel_size=1, bias=True)

    def forward(self, x):
        gate = F.adaptive_avg_pool2d(x, 1)
        gate = torch.sigmoid(self.se2(swish(self.se1(gate))))
        return x * gate


class Block(nn.Module):
    """MBConv: 1x1 expand, kxk depthwise, SE, 1x1 linear projection."""

    def __init__(self, in_channels, out_channels, kernel_size, stride,
                 expand_ratio=1, se_ratio=0.0, drop_rate=0.0):
        super().__init__()
        self.stride = stride
        self.drop_rate = drop_rate
        self.expand_ratio = expand_ratio
        channels = expand_ratio * in_channels
        # Built even when expand_ratio == 1, where forward skips it: kuangliu's
        # checkpoints contain these weights, so strict loading needs them.
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        if expand_ratio == 1:
            # Never trained, so DDP (which expects a gradient for every parameter that wants
            # one) and Horovod leave them out, and the optimizer does not decay them.
            for p in (*self.conv1.parameters(), *self.bn1.parameters()):
                p.requires_grad_(False)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=kernel_size, stride=stride,
                               padding=(kernel_size - 1) // 2, groups=channels, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        # SE width is a fraction of the block *input* width, as in the paper.
        self.se = SE(channels, int(in_channels * se_ratio))
        self.conv3 = nn.Conv2d(channels, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.has_skip = stride == 1 and in_channels == out_channels

    def forward(self, x):
        y = x if self.expand_ratio == 1 else swish(self.bn1(self.conv1(x)))
        y = swish(self.bn2(self.conv2(y)))
        y = self.se(y)
        y = self.bn3(self.conv3(y))
        if not self.has_skip:
            return y
        if self.training and self.drop_rate > 0:
            y = drop_connect(y, self.drop_rate)
        return y + x


class EfficientNet(nn.Module):
    def __init__(self, cfg, num_classes=10):
        super().__init__()
        self.cfg = cfg
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.layers = self._make_layers(32)
        self.linear = nn.Linear(cfg["out_channels"][-1], num_classes)

    def _make_layers(self, in_channels):
        cfg = self.cfg
        stages = zip(cfg["expansion"], cfg["out_channels"], cfg["num_blocks"],
                     cfg["kernel_size"], cfg["stride"])
        total = sum(cfg["num_blocks"])
        blocks = []
        for expansion, out_channels, count, kernel_size, stride in stages:
            for s in [stride] + [1] * (count - 1):
                # Stochastic depth grows linearly with block index, from 0 up
                # to drop_connect_rate.
                drop_rate = cfg["drop_connect_rate"] * len(blocks) / total
                blocks.append(Block(in_channels, out_channels, kernel_size, s, expansion,
                                    se_ratio=0.25, drop_rate=drop_rate))
                in_channels = out_channels
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = swish(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        if self.training and self.cfg["dropout_rate"] > 0:
            x = F.dropout(x, p=self.cfg["dropout_rate"])
        return self.linear(x)


def EfficientNetB0(num_classes=10):
    cfg = {
        "num_blocks": [1, 2, 2, 3, 3, 4, 1],
        "expansion": [1, 6, 6, 6, 6, 6, 6],
        "out_channels": [16, 24, 40, 80, 112, 192, 320],
        "kernel_size": [3, 3, 5, 3, 5, 5, 3],
        "stride": [1, 2, 2, 2, 1, 2, 1],
        "dropout_rate": 0.2,
        # kuangliu's schedule never advances its block counter, so every block
        # gets rate 0 there. 0.0 here reproduces that training behaviour
        # exactly; raise it to enable real stochastic depth.
        "drop_connect_rate": 0.0,
    }
    return EfficientNet(cfg, num_classes)
