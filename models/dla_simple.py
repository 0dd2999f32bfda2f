"""SimpleDLA: a simplified Deep Layer Aggregation network for CIFAR.

Reference:
    Fisher Yu, Dequan Wang, Evan Shelhamer, Trevor Darrell.
    "Deep Layer Aggregation". 2017.
    arXiv:1707.06484

Not the paper's exact network (see dla.py): kuangliu/pytorch-cifar's
simplification where each tree is binary and every root aggregates only its
two children.
"""
from torch import nn

# The same residual block and aggregation node as the full DLA.
from . import dla
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


class SimpleDLA(dla.DLA):
    """dla.DLA's stem, stages and head around the binary Tree above."""

    def __init__(self, block=BasicBlock, num_classes=10):
        super().__init__(block, num_classes, tree=Tree)
