"""Deep Layer Aggregation (DLA) for 32x32 CIFAR images.

Reference:
    Fisher Yu, Dequan Wang, Evan Shelhamer, Trevor Darrell.
    "Deep Layer Aggregation". 2017.
    arXiv:1707.06484

Hierarchical (tree) aggregation of residual blocks: an aggregation node
(`Root`) concatenates the outputs of a tree's children and merges them with a
1x1 conv. Layout as in kuangliu/pytorch-cifar's dla.py; see dla_simple.py for
the lighter binary-tree variant.
"""
import torch
from torch import nn
import torch.nn.functional as F

# DLA's residual block is ResNet's, with the same submodule names.
from .resnet import BasicBlock


class Root(nn.Module):
    """Aggregation node: concat inputs, conv, BN, ReLU."""

    def __init__(self, in_channels, out_channels, kernel_size=1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=1,
                              padding=(kernel_size - 1) // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, xs):
        return F.relu(self.bn(self.conv(torch.cat(xs, 1))))


class Tree(nn.Module):
    """A level-L tree feeding every intermediate output into one root.

    Level 1: two blocks in sequence (left_node, right_node), both aggregated.
    Level L > 1: a block straight from the input (prev_root), the chain of
    subtrees level_{L-1} ... level_1, then left_node and right_node; all
    L + 2 outputs are aggregated.
    """

    def __init__(self, block, in_channels, out_channels, level=1, stride=1):
        super().__init__()
        self.level = level
        if level == 1:
            self.root = Root(2 * out_channels, out_channels)
            self.left_node = block(in_channels, out_channels, stride=stride)
            self.right_node = block(out_channels, out_channels, stride=1)
            return
        self.root = Root((level + 2) * out_channels, out_channels)
        # Registered from the highest level down, like kuangliu; each subtree
        # gets the tree input (so they all downsample by `stride`).
        for i in reversed(range(1, level)):
            setattr(self, f"level_{i}",
                    Tree(block, in_channels, out_channels, level=i, stride=stride))
        self.prev_root = block(in_channels, out_channels, stride=stride)
        self.left_node = block(out_channels, out_channels, stride=1)
        self.right_node = block(out_channels, out_channels, stride=1)

    def forward(self, x):
        outs = [self.prev_root(x)] if self.level > 1 else []
        for i in reversed(range(1, self.level)):
            x = getattr(self, f"level_{i}")(x)
            outs.append(x)
        x = self.left_node(x)
        outs.append(x)
        x = self.right_node(x)
        outs.append(x)
        return self.root(outs)


def _conv_bn_relu(in_planes, out_planes):
    return nn.Sequential(
        nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(out_planes),
        nn.ReLU(True),
    )


class DLA(nn.Module):
    """The network around the trees; dla_simple.SimpleDLA is this with its binary Tree."""

    def __init__(self, block=BasicBlock, num_classes=10, tree=None):
        super().__init__()
        tree = tree or Tree
        self.base = _conv_bn_relu(3, 16)
        self.layer1 = _conv_bn_relu(16, 16)
        self.layer2 = _conv_bn_relu(16, 32)
        self.layer3 = tree(block, 32, 64, level=1, stride=1)
        self.layer4 = tree(block, 64, 128, level=2, stride=2)
        self.layer5 = tree(block, 128, 256, level=2, stride=2)
        self.layer6 = tree(block, 256, 512, level=1, stride=2)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.base(x)))
        x = self.layer6(self.layer5(self.layer4(self.layer3(x))))
        x = F.avg_pool2d(x, 4)  # 4x4 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))
