"""MobileNet (v1) for 32x32 CIFAR images.

Reference:
    Andrew G. Howard, Menglong Zhu, Bo Chen, Dmitry Kalenichenko, Weijun Wang,
    Tobias Weyand, Marco Andreetto, Hartwig Adam.
    "MobileNets: Efficient Convolutional Neural Networks for Mobile Vision
    Applications". 2017.
    arXiv:1704.04861

Depthwise-separable blocks with the widths of table 1. CIFAR variant (as in
kuangliu/pytorch-cifar): stride-1 stem, so four stride-2 blocks take 32x32 to
2x2.
"""
import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    """Depthwise 3x3 conv then pointwise 1x1 conv, each with BN + ReLU."""

    def __init__(self, in_planes, out_planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, in_planes, kernel_size=3, stride=stride, padding=1,
                               groups=in_planes, bias=False)
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv2 = nn.Conv2d(in_planes, out_planes, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(x)))


class MobileNet(nn.Module):
    # (out_planes, stride) per block, as in table 1 after the stem.
    cfg = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
           (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        blocks, planes = [], 32
        for out_planes, stride in self.cfg:
            blocks.append(Block(planes, out_planes, stride))
            planes = out_planes
        self.layers = nn.Sequential(*blocks)
        self.linear = nn.Linear(1024, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = F.avg_pool2d(x, 2)  # 2x2 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))
