"""ShuffleNet (v1) with 2 or 3 groups, for 32x32 CIFAR images.

Reference:
    Xiangyu Zhang, Xinyu Zhou, Mengxiao Lin, Jian Sun.
    "ShuffleNet: An Extremely Efficient Convolutional Neural Network for Mobile
    Devices". 2017.
    arXiv:1707.01083

Grouped 1x1 convs, a channel shuffle so information crosses groups, and a
depthwise 3x3 conv. Stride-2 units concatenate an average-pooled copy of the
input instead of adding it. CIFAR variant as in kuangliu/pytorch-cifar (1x1
stem with 24 channels, three stages).

kuangliu's code computes the bottleneck width as out_planes / 4, a float on
Python 3, so nn.Conv2d rejects it and neither ShuffleNetG2 nor ShuffleNetG3
constructs there. Integer division gives the intended (exact) widths; all
names and shapes are otherwise the same.
"""
import torch
from torch import nn
import torch.nn.functional as F


def channel_shuffle(x, groups):
    """[N, g*c, H, W] -> interleave the g groups' channels -> [N, c*g, H, W]."""
    n, channels, h, w = x.shape
    x = x.view(n, groups, channels // groups, h, w).transpose(1, 2)
    return x.reshape(n, channels, h, w)


class ShuffleBlock(nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        return channel_shuffle(x, self.groups)


class Bottleneck(nn.Module):
    def __init__(self, in_planes, out_planes, stride, groups):
        super().__init__()
        self.stride = stride
        mid_planes = out_planes // 4
        # The paper leaves the first 1x1 conv of stage 2 ungrouped: its input
        # (the 24-channel stem) is too narrow to split usefully.
        g = 1 if in_planes == 24 else groups
        self.conv1 = nn.Conv2d(in_planes, mid_planes, kernel_size=1, groups=g, bias=False)
        self.bn1 = nn.BatchNorm2d(mid_planes)
        self.shuffle1 = ShuffleBlock(groups=g)
        self.conv2 = nn.Conv2d(mid_planes, mid_planes, kernel_size=3, stride=stride, padding=1,
                               groups=mid_planes, bias=False)
        self.bn2 = nn.BatchNorm2d(mid_planes)
        self.conv3 = nn.Conv2d(mid_planes, out_planes, kernel_size=1, groups=groups, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        if stride == 2:
            self.shortcut = nn.Sequential(nn.AvgPool2d(3, stride=2, padding=1))
        else:
            self.shortcut = nn.Sequential()

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.shuffle1(y)
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        skip = self.shortcut(x)
        if self.stride == 2:
            return F.relu(torch.cat([y, skip], 1))
        return F.relu(y + skip)


class ShuffleNet(nn.Module):
    def __init__(self, cfg, num_classes=10):
        super().__init__()
        out_planes, num_blocks, groups = cfg["out_planes"], cfg["num_blocks"], cfg["groups"]
        self.conv1 = nn.Conv2d(3, 24, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(24)
        self.in_planes = 24
        self.layer1 = self._make_layer(out_planes[0], num_blocks[0], groups)
        self.layer2 = self._make_layer(out_planes[1], num_blocks[1], groups)
        self.layer3 = self._make_layer(out_planes[2], num_blocks[2], groups)
        self.linear = nn.Linear(out_planes[2], num_classes)

    def _make_layer(self, out_planes, count, groups):
        blocks = []
        for i in range(count):
            if i == 0:
                # The stride-2 unit concatenates its pooled input, so its conv
                # branch only has to produce the remaining channels.
                blocks.append(Bottleneck(self.in_planes, out_planes - self.in_planes, 2, groups))
            else:
                blocks.append(Bottleneck(self.in_planes, out_planes, 1, groups))
            self.in_planes = out_planes
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = F.avg_pool2d(x, 4)  # 4x4 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))


def ShuffleNetG2(num_classes=10):
    return ShuffleNet({"out_planes": [200, 400, 800], "num_blocks": [4, 8, 4], "groups": 2},
                      num_classes)


def ShuffleNetG3(num_classes=10):
    return ShuffleNet({"out_planes": [240, 480, 960], "num_blocks": [4, 8, 4], "groups": 3},
                      num_classes)
