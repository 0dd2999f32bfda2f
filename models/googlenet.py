"""GoogLeNet (Inception v1) with batch norm, for 32x32 CIFAR images.

Reference:
    Christian Szegedy, Wei Liu, Yangqing Jia, Pierre Sermanet, Scott Reed,
    Dragomir Anguelov, Dumitru Erhan, Vincent Vanhoucke, Andrew Rabinovich.
    "Going Deeper with Convolutions". 2014.
    arXiv:1409.4842

CIFAR variant (as in kuangliu/pytorch-cifar): a single 3x3 conv stem, BN after
every conv, the "5x5" branch built from two 3x3 convs, and no auxiliary
classifiers. Inception widths are those of table 1 of the paper.
"""
import torch
from torch import nn


def _conv_bn_relu(in_planes, out_planes, kernel_size):
    # Returned as a list so branches can be flattened into one Sequential and
    # keep kuangliu's indices (conv at 0/3/6, bn at 1/4/7).
    return [
        nn.Conv2d(in_planes, out_planes, kernel_size=kernel_size, padding=kernel_size // 2),
        nn.BatchNorm2d(out_planes),
        nn.ReLU(True),
    ]


class Inception(nn.Module):
    """Four parallel branches concatenated along channels."""

    def __init__(self, in_planes, n1x1, n3x3red, n3x3, n5x5red, n5x5, pool_planes):
        super().__init__()
        self.b1 = nn.Sequential(*_conv_bn_relu(in_planes, n1x1, 1))
        self.b2 = nn.Sequential(*_conv_bn_relu(in_planes, n3x3red, 1),
                                *_conv_bn_relu(n3x3red, n3x3, 3))
        # Two stacked 3x3 convs cover a 5x5 receptive field more cheaply.
        self.b3 = nn.Sequential(*_conv_bn_relu(in_planes, n5x5red, 1),
                                *_conv_bn_relu(n5x5red, n5x5, 3),
                                *_conv_bn_relu(n5x5, n5x5, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1),
                                *_conv_bn_relu(in_planes, pool_planes, 1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.pre_layers = nn.Sequential(*_conv_bn_relu(3, 192, 3))

        self.a3 = Inception(192, 64, 96, 128, 16, 32, 32)
        self.b3 = Inception(256, 128, 128, 192, 32, 96, 64)

        # One pooling module, applied twice (32 -> 16 -> 8); it has no state.
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)

        self.a4 = Inception(480, 192, 96, 208, 16, 48, 64)
        self.b4 = Inception(512, 160, 112, 224, 24, 64, 64)
        self.c4 = Inception(512, 128, 128, 256, 24, 64, 64)
        self.d4 = Inception(512, 112, 144, 288, 32, 64, 64)
        self.e4 = Inception(528, 256, 160, 320, 32, 128, 128)

        self.a5 = Inception(832, 256, 160, 320, 32, 128, 128)
        self.b5 = Inception(832, 384, 192, 384, 48, 128, 128)

        # The final map is 8x8 for a 32x32 input, so this is a global pool.
        self.avgpool = nn.AvgPool2d(8, stride=1)
        self.linear = nn.Linear(1024, num_classes)

    def forward(self, x):
        x = self.pre_layers(x)
        x = self.maxpool(self.b3(self.a3(x)))
        x = self.e4(self.d4(self.c4(self.b4(self.a4(x)))))
        x = self.maxpool(x)
        x = self.b5(self.a5(x))
        x = self.avgpool(x)
        return self.linear(torch.flatten(x, 1))
