"""Dual Path Networks (DPN-26, DPN-92) for 32x32 CIFAR images.

Reference:
    Yunpeng Chen, Jianan Li, Huaxin Xiao, Xiaojie Jin, Shuicheng Yan, Jiashi Feng.
    "Dual Path Networks". 2017.
    arXiv:1707.01629

Each block's output is split: the first out_planes channels are added to the
residual path (ResNet-like, feature re-use) and the remaining channels are
appended to a growing densely connected path (DenseNet-like, new features).
CIFAR variant as in kuangliu/pytorch-cifar (3x3 stem, no max-pool).
"""
import torch
from torch import nn
import torch.nn.functional as F


class Bottleneck(nn.Module):
    def __init__(self, last_planes, in_planes, out_planes, dense_depth, stride, first_layer):
        super().__init__()
        self.out_planes = out_planes
        self.dense_depth = dense_depth
        produced = out_planes + dense_depth
        self.conv1 = nn.Conv2d(last_planes, in_planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(in_planes)
        # Grouped 3x3 conv with 32 groups, as in the ResNeXt-style DPN block.
        self.conv2 = nn.Conv2d(in_planes, in_planes, kernel_size=3, stride=stride, padding=1,
                               groups=32, bias=False)
        self.bn2 = nn.BatchNorm2d(in_planes)
        self.conv3 = nn.Conv2d(in_planes, produced, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(produced)
        if first_layer:
            # The first block of a stage starts both paths afresh from a projection.
            self.shortcut = nn.Sequential(
                nn.Conv2d(last_planes, produced, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(produced),
            )
        else:
            self.shortcut = nn.Sequential()

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        x = self.shortcut(x)
        d = self.out_planes
        # [residual sum | old dense channels | new dense channels]
        merged = torch.cat([x[:, :d] + y[:, :d], x[:, d:], y[:, d:]], 1)
        return F.relu(merged)


class DPN(nn.Module):
    def __init__(self, cfg, num_classes=10):
        super().__init__()
        in_planes, out_planes = cfg["in_planes"], cfg["out_planes"]
        num_blocks, dense_depth = cfg["num_blocks"], cfg["dense_depth"]
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.last_planes = 64
        self.layer1 = self._make_layer(in_planes[0], out_planes[0], num_blocks[0],
                                        dense_depth[0], 1)
        self.layer2 = self._make_layer(in_planes[1], out_planes[1], num_blocks[1],
                                        dense_depth[1], 2)
        self.layer3 = self._make_layer(in_planes[2], out_planes[2], num_blocks[2],
                                        dense_depth[2], 2)
        self.layer4 = self._make_layer(in_planes[3], out_planes[3], num_blocks[3],
                                        dense_depth[3], 2)
        self.linear = nn.Linear(self.last_planes, num_classes)

    def _make_layer(self, in_planes, out_planes, count, dense_depth, stride):
        blocks = []
        for i in range(count):
            blocks.append(Bottleneck(self.last_planes, in_planes, out_planes, dense_depth,
                                     stride if i == 0 else 1, i == 0))
            # The projection seeds one dense_depth slice; each block adds another.
            self.last_planes = out_planes + (i + 2) * dense_depth
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.avg_pool2d(x, 4)  # 4x4 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))


def DPN26(num_classes=10):
    cfg = {
        "in_planes": (96, 192, 384, 768),
        "out_planes": (256, 512, 1024, 2048),
        "num_blocks": (2, 2, 2, 2),
        "dense_depth": (16, 32, 24, 128),
    }
    return DPN(cfg, num_classes)


def DPN92(num_classes=10):
    cfg = {
        "in_planes": (96, 192, 384, 768),
        "out_planes": (256, 512, 1024, 2048),
        "num_blocks": (3, 4, 20, 3),
        "dense_depth": (16, 32, 24, 128),
    }
    return DPN(cfg, num_classes)
