"""DenseNet-BC (121/161/169/201 and a small CIFAR one) for 32x32 images.

Reference:
    Gao Huang, Zhuang Liu, Laurens van der Maaten, Kilian Q. Weinberger.
    "Densely Connected Convolutional Networks". 2016.
    arXiv:1608.06993

Bottleneck (BN-ReLU-1x1-BN-ReLU-3x3) layers with compression 0.5 in the
transitions. CIFAR variant (as in kuangliu/pytorch-cifar): a 3x3 stem of
2*growth_rate channels and no initial pooling, four dense blocks with the
ImageNet block counts.
"""
import math

import torch
from torch import nn
import torch.nn.functional as F


class Bottleneck(nn.Module):
    """One dense layer: adds growth_rate new channels to its input."""

    def __init__(self, in_planes, growth_rate):
        super().__init__()
        inner = 4 * growth_rate  # the paper's 4k bottleneck width
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, inner, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, growth_rate, kernel_size=3, padding=1, bias=False)

    def forward(self, x):
        new = self.conv1(F.relu(self.bn1(x)))
        new = self.conv2(F.relu(self.bn2(new)))
        # New features first, then the input: the order kuangliu's weights expect.
        return torch.cat([new, x], 1)


class Transition(nn.Module):
    """BN-ReLU-1x1 conv (compression) then 2x2 average pool."""

    def __init__(self, in_planes, out_planes):
        super().__init__()
        self.bn = nn.BatchNorm2d(in_planes)
        self.conv = nn.Conv2d(in_planes, out_planes, kernel_size=1, bias=False)

    def forward(self, x):
        return F.avg_pool2d(self.conv(F.relu(self.bn(x))), 2)


class DenseNet(nn.Module):
    def __init__(self, block, nblocks, growth_rate=12, reduction=0.5, num_classes=10):
        super().__init__()
        self.growth_rate = growth_rate
        planes = 2 * growth_rate
        self.conv1 = nn.Conv2d(3, planes, kernel_size=3, padding=1, bias=False)

        # Three dense block + transition pairs, then a last dense block.
        self.dense1, planes = self._dense(block, planes, nblocks[0])
        self.trans1, planes = self._transition(planes, reduction)
        self.dense2, planes = self._dense(block, planes, nblocks[1])
        self.trans2, planes = self._transition(planes, reduction)
        self.dense3, planes = self._dense(block, planes, nblocks[2])
        self.trans3, planes = self._transition(planes, reduction)
        self.dense4, planes = self._dense(block, planes, nblocks[3])

        self.bn = nn.BatchNorm2d(planes)
        self.linear = nn.Linear(planes, num_classes)

    def _dense(self, block, in_planes, count):
        layers = [block(in_planes + i * self.growth_rate, self.growth_rate) for i in range(count)]
        return nn.Sequential(*layers), in_planes + count * self.growth_rate

    @staticmethod
    def _transition(in_planes, reduction):
        out_planes = int(math.floor(in_planes * reduction))
        return Transition(in_planes, out_planes), out_planes

    def forward(self, x):
        x = self.conv1(x)
        x = self.trans1(self.dense1(x))
        x = self.trans2(self.dense2(x))
        x = self.trans3(self.dense3(x))
        x = self.dense4(x)
        # Final map is 4x4 for a 32x32 input: global average pool.
        x = F.avg_pool2d(F.relu(self.bn(x)), 4)
        return self.linear(torch.flatten(x, 1))


def DenseNet121(num_classes=10):
    return DenseNet(Bottleneck, [6, 12, 24, 16], growth_rate=32, num_classes=num_classes)


def DenseNet169(num_classes=10):
    return DenseNet(Bottleneck, [6, 12, 32, 32], growth_rate=32, num_classes=num_classes)


def DenseNet201(num_classes=10):
    return DenseNet(Bottleneck, [6, 12, 48, 32], growth_rate=32, num_classes=num_classes)


def DenseNet161(num_classes=10):
    return DenseNet(Bottleneck, [6, 12, 36, 24], growth_rate=48, num_classes=num_classes)


def densenet_cifar(num_classes=10):
    # DenseNet-121's layout with growth rate 12: about 1M parameters.
    return DenseNet(Bottleneck, [6, 12, 24, 16], growth_rate=12, num_classes=num_classes)
