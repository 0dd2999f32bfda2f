"""ResNeXt-29 (2x64d, 4x64d, 8x64d, 32x4d) for 32x32 CIFAR images.

Reference:
    Saining Xie, Ross Girshick, Piotr Dollar, Zhuowen Tu, Kaiming He.
    "Aggregated Residual Transformations for Deep Neural Networks". 2016.
    arXiv:1611.05431

"CxWd" means cardinality C (conv groups) and bottleneck width W per group in
the first stage; the width doubles at each of the three stages. As in
kuangliu/pytorch-cifar the stem is a 1x1 conv and each block outputs twice its
group width.
"""
import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    """Grouped-convolution bottleneck (the paper's form (c))."""

    expansion = 2

    def __init__(self, in_planes, cardinality=32, bottleneck_width=4, stride=1):
        super().__init__()
        width = cardinality * bottleneck_width
        out_planes = self.expansion * width
        self.conv1 = nn.Conv2d(in_planes, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1,
                               groups=cardinality, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_planes, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        if stride != 1 or in_planes != out_planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_planes),
            )
        else:
            self.shortcut = nn.Sequential()  # identity, no state

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.shortcut(x))


class ResNeXt(nn.Module):
    def __init__(self, num_blocks, cardinality, bottleneck_width, num_classes=10):
        super().__init__()
        self.cardinality = cardinality
        self.bottleneck_width = bottleneck_width
        self.in_planes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = self._make_layer(num_blocks[0], 1)
        self.layer2 = self._make_layer(num_blocks[1], 2)
        self.layer3 = self._make_layer(num_blocks[2], 2)
        # Three stages each doubled the width: final channels = 2 * C * W * 4.
        self.linear = nn.Linear(cardinality * bottleneck_width * 8, num_classes)

    def _make_layer(self, count, stride):
        blocks = []
        for s in [stride] + [1] * (count - 1):
            blocks.append(Block(self.in_planes, self.cardinality, self.bottleneck_width, s))
            self.in_planes = Block.expansion * self.cardinality * self.bottleneck_width
        self.bottleneck_width *= 2  # next stage is twice as wide
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = F.avg_pool2d(x, 8)  # 8x8 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))


def ResNeXt29_2x64d(num_classes=10):
    return ResNeXt([3, 3, 3], cardinality=2, bottleneck_width=64, num_classes=num_classes)


def ResNeXt29_4x64d(num_classes=10):
    return ResNeXt([3, 3, 3], cardinality=4, bottleneck_width=64, num_classes=num_classes)


def ResNeXt29_8x64d(num_classes=10):
    return ResNeXt([3, 3, 3], cardinality=8, bottleneck_width=64, num_classes=num_classes)


def ResNeXt29_32x4d(num_classes=10):
    return ResNeXt([3, 3, 3], cardinality=32, bottleneck_width=4, num_classes=num_classes)
