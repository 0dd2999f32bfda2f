"""Pre-activation ResNet-18/34/50/101/152 for 32x32 CIFAR images.

Reference:
    Kaiming He, Xiangyu Zhang, Shaoqing Ren, Jian Sun.
    "Identity Mappings in Deep Residual Networks". 2016.
    arXiv:1603.05027

BN and ReLU come before each conv, so the identity path carries the block input
untouched. As in kuangliu/pytorch-cifar there is no BN+ReLU after the last
block and the projection shortcut is a bare 1x1 conv applied to the
pre-activated input.
"""
import torch
from torch import nn
import torch.nn.functional as F


def _maybe_projection(module, in_planes, out_planes, stride):
    # Only create the attribute when a projection is needed: kuangliu tests for
    # its presence, and an identity has no state to save either way.
    if stride != 1 or in_planes != out_planes:
        module.shortcut = nn.Sequential(
            nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)
        )


class PreActBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1,
                               bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        _maybe_projection(self, in_planes, planes * self.expansion, stride)

    def forward(self, x):
        pre = F.relu(self.bn1(x))
        # The projection sees the activated input; the identity sees the raw one.
        skip = self.shortcut(pre) if hasattr(self, "shortcut") else x
        y = self.conv1(pre)
        y = self.conv2(F.relu(self.bn2(y)))
        return y + skip


class PreActBottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, kernel_size=1, bias=False)
        _maybe_projection(self, in_planes, planes * self.expansion, stride)

    def forward(self, x):
        pre = F.relu(self.bn1(x))
        skip = self.shortcut(pre) if hasattr(self, "shortcut") else x
        y = self.conv1(pre)
        y = self.conv2(F.relu(self.bn2(y)))
        y = self.conv3(F.relu(self.bn3(y)))
        return y + skip


class PreActResNet(nn.Module):
    def __init__(self, block, num_blocks, num_classes=10):
        super().__init__()
        self.in_planes = 64
        # No BN/ReLU on the stem: the first block pre-activates its input.
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.layer1 = self._make_layer(block, 64, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, 128, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, 256, num_blocks[2], stride=2)
        self.layer4 = self._make_layer(block, 512, num_blocks[3], stride=2)
        self.linear = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block, planes, count, stride):
        blocks = []
        for s in [stride] + [1] * (count - 1):
            blocks.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = self.conv1(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.avg_pool2d(x, 4)  # 4x4 map for 32x32 input: global average pool
        return self.linear(torch.flatten(x, 1))


def PreActResNet18(num_classes=10):
    return PreActResNet(PreActBlock, [2, 2, 2, 2], num_classes)


def PreActResNet34(num_classes=10):
    return PreActResNet(PreActBlock, [3, 4, 6, 3], num_classes)


def PreActResNet50(num_classes=10):
    return PreActResNet(PreActBottleneck, [3, 4, 6, 3], num_classes)


def PreActResNet101(num_classes=10):
    return PreActResNet(PreActBottleneck, [3, 4, 23, 3], num_classes)


def PreActResNet152(num_classes=10):
    return PreActResNet(PreActBottleneck, [3, 8, 36, 3], num_classes)
