"""RegNetX-200MF, RegNetX-400MF and RegNetY-400MF for 32x32 CIFAR images.

Reference:
    Ilija Radosavovic, Raj Prateek Kosaraju, Ross Girshick, Kaiming He, Piotr Dollar.
    "Designing Network Design Spaces". 2020.
    arXiv:2003.13678

X blocks are ResNeXt-style bottlenecks with a fixed group width; Y blocks add
squeeze-excitation. Depths, widths and group widths are the paper's 200MF/400MF
models. CIFAR variant (as in kuangliu/pytorch-cifar): 3x3 stride-1 stem with
64 channels and stride 1 in the first two stages.
"""
import torch
from torch import nn
import torch.nn.functional as F


class SE(nn.Module):
    """Squeeze-and-excitation gate (ReLU inside, sigmoid out)."""

    def __init__(self, in_planes, se_planes):
        super().__init__()
        self.se1 = nn.Conv2d(in_planes, se_planes, kernel_size=1, bias=True)
        self.se2 = nn.Conv2d(se_planes, in_planes, kernel_size=1, bias=True)

    def forward(self, x):
        gate = F.adaptive_avg_pool2d(x, 1)
        gate = torch.sigmoid(self.se2(F.relu(self.se1(gate))))
        return x * gate


class Block(nn.Module):
    def __init__(self, w_in, w_out, stride, group_width, bottleneck_ratio, se_ratio):
        super().__init__()
        w_b = int(round(w_out * bottleneck_ratio))
        self.conv1 = nn.Conv2d(w_in, w_b, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(w_b)
        # Fixed channels per group, so the group count follows the width.
        self.conv2 = nn.Conv2d(w_b, w_b, kernel_size=3, stride=stride, padding=1,
                               groups=w_b // group_width, bias=False)
        self.bn2 = nn.BatchNorm2d(w_b)
        self.with_se = se_ratio > 0
        if self.with_se:
            # SE width is relative to the block input width (as in the paper).
            self.se = SE(w_b, int(round(w_in * se_ratio)))
        self.conv3 = nn.Conv2d(w_b, w_out, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(w_out)
        if stride != 1 or w_in != w_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(w_in, w_out, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(w_out),
            )
        else:
            self.shortcut = nn.Sequential()  # identity, no state

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        if self.with_se:
            y = self.se(y)
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.shortcut(x))


class RegNet(nn.Module):
    def __init__(self, cfg, num_classes=10):
        super().__init__()
        self.cfg = cfg
        self.in_planes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = self._make_layer(0)
        self.layer2 = self._make_layer(1)
        self.layer3 = self._make_layer(2)
        self.layer4 = self._make_layer(3)
        self.linear = nn.Linear(cfg["widths"][-1], num_classes)

    def _make_layer(self, idx):
        cfg = self.cfg
        width, stride = cfg["widths"][idx], cfg["strides"][idx]
        blocks = []
        for i in range(cfg["depths"][idx]):
            blocks.append(Block(self.in_planes, width, stride if i == 0 else 1,
                                cfg["group_width"], cfg["bottleneck_ratio"], cfg["se_ratio"]))
            self.in_planes = width
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.linear(torch.flatten(x, 1))


def RegNetX_200MF(num_classes=10):
    cfg = {
        "depths": [1, 1, 4, 7],
        "widths": [24, 56, 152, 368],
        "strides": [1, 1, 2, 2],
        "group_width": 8,
        "bottleneck_ratio": 1,
        "se_ratio": 0,
    }
    return RegNet(cfg, num_classes)


def RegNetX_400MF(num_classes=10):
    cfg = {
        "depths": [1, 2, 7, 12],
        "widths": [32, 64, 160, 384],
        "strides": [1, 1, 2, 2],
        "group_width": 16,
        "bottleneck_ratio": 1,
        "se_ratio": 0,
    }
    return RegNet(cfg, num_classes)


def RegNetY_400MF(num_classes=10):
    cfg = {
        "depths": [1, 2, 7, 12],
        "widths": [32, 64, 160, 384],
        "strides": [1, 1, 2, 2],
        "group_width": 16,
        "bottleneck_ratio": 1,
        "se_ratio": 0.25,
    }
    return RegNet(cfg, num_classes)
