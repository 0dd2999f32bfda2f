"""MobileNetV2 for 32x32 CIFAR images.

Reference:
    Mark Sandler, Andrew Howard, Menglong Zhu, Andrey Zhmoginov, Liang-Chieh Chen.
    "MobileNetV2: Inverted Residuals and Linear Bottlenecks". 2018.
    arXiv:1801.04381

Inverted residual blocks (1x1 expand, 3x3 depthwise, linear 1x1 project) with
the settings of table 2. CIFAR variant (as in kuangliu/pytorch-cifar): the stem
and the second stage use stride 1 instead of 2, so the final map is 4x4, and
stride-1 blocks that change width get a 1x1 conv + BN shortcut.
"""
import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    """Inverted residual: expand, depthwise, project (no ReLU after project)."""

    def __init__(self, in_planes, out_planes, expansion, stride):
        super().__init__()
        self.stride = stride
        planes = expansion * in_planes
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1,
                               groups=planes, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        if stride == 1 and in_planes != out_planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, kernel_size=1, bias=False),
                nn.BatchNorm2d(out_planes),
            )
        else:
            self.shortcut = nn.Sequential()  # identity (unused when stride is 2)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        # Downsampling blocks have no residual path.
        return y + self.shortcut(x) if self.stride == 1 else y


class MobileNetV2(nn.Module):
    # (expansion t, out channels c, repeats n, first stride s), table 2.
    cfg = [(1, 16, 1, 1),
           (6, 24, 2, 1),  # stride 2 in the paper; 1 keeps resolution on CIFAR
           (6, 32, 3, 2),
           (6, 64, 4, 2),
           (6, 96, 3, 1),
           (6, 160, 3, 2),
           (6, 320, 1, 1)]

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        blocks, planes = [], 32
        for expansion, out_planes, repeats, stride in self.cfg:
            for s in [stride] + [1] * (repeats - 1):
                blocks.append(Block(planes, out_planes, expansion, s))
                planes = out_planes
        self.layers = nn.Sequential(*blocks)
        self.conv2 = nn.Conv2d(320, 1280, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(1280)
        self.linear = nn.Linear(1280, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.avg_pool2d(x, 4)  # 4x4 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))
