"""SimpleDLA: a simplified Deep Layer Aggregation network for CIFAR.

Reference:
    Fisher Yu, Dequan Wang, Evan Shelhamer, Trevor Darrell.
    "Deep Layer Aggregation". 2017.
    arXiv:1707.06484

Not the paper's exact network (see dla.py): kuangliu/pytorch-cifar's
simplification where each tree is binary and every root aggregates only its
two children.
"""
import torch
from torch import nn
import torch.nn.functional as F

# The same residual block and aggregation node as the full DLA.
from .dla import BasicBlock, Root


class Tree(nn.Module):
    """Binary tree: left subtree, right subtree on its output, root of both."""

    def __init__(self, block, in_channels, out_channels, level=1, stride=1):
        super().__init__()
        self.root = Root(2 * out_channels, out_channels)
        if level == 1:
            self.left_tree = block(in_channels, out_channels, stride=stride)
            self.right_tree = block(out_channels, out_channels, stride=1)
        else:
            self.left_tree = Tree(block, in_channels, out_channels, level=level - 1, stride=stride)
            self.right_tree = Tree(block, out_channels, out_channels, level=level - 1, stride=1)

    def forward(self, x):
        left = self.left_tree(x)
        right = self.right_tree(left)
        return self.root([left, right])


def _conv_bn_relu(in_planes, out_planes):
    return nn.Sequential(
        nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(out_planes),
        nn.ReLU(True),
    )


class SimpleDLA(nn.Module):
    def __init__(self, block=BasicBlock, num_classes=10):
        super().__init__()
        self.base = _conv_bn_relu(3, 16)
        self.layer1 = _conv_bn_relu(16, 16)
        self.layer2 = _conv_bn_relu(16, 32)
        self.layer3 = Tree(block, 32, 64, level=1, stride=1)
        self.layer4 = Tree(block, 64, 128, level=2, stride=2)
        self.layer5 = Tree(block, 128, 256, level=2, stride=2)
        self.layer6 = Tree(block, 256, 512, level=1, stride=2)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.base(x)))
        x = self.layer6(self.layer5(self.layer4(self.layer3(x))))
        x = F.avg_pool2d(x, 4)  # 4x4 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))
