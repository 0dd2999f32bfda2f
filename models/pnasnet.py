"""PNASNet-A and PNASNet-B style networks for 32x32 CIFAR images.

Reference:
    Chenxi Liu, Barret Zoph, Maxim Neumann, Jonathon Shlens, Wei Hua, Li-Jia Li,
    Li Fei-Fei, Alan Yuille, Jonathan Huang, Kevin Murphy.
    "Progressive Neural Architecture Search". 2017.
    arXiv:1712.00559

Small hand-written cells in the spirit of the searched ones, as in
kuangliu/pytorch-cifar (not the published PNASNet-5 cell): cell A sums a 7x7
"separable" conv and a max-pool; cell B has two such pairs and merges them with
a 1x1 conv. Three stages of 6 cells with a stride-2 cell between stages.
"""
import torch
from torch import nn
import torch.nn.functional as F


class SepConv(nn.Module):
    """Grouped kxk conv (groups = in_planes) + BN.

    Named "separable" after the paper, but, like kuangliu's, it has no
    pointwise conv: each input channel maps to out/in output channels.
    """

    def __init__(self, in_planes, out_planes, kernel_size, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, out_planes, kernel_size, stride,
                               padding=(kernel_size - 1) // 2, bias=False, groups=in_planes)
        self.bn1 = nn.BatchNorm2d(out_planes)

    def forward(self, x):
        return self.bn1(self.conv1(x))


def _pool_projection(cell, in_planes, out_planes):
    # Stride-2 cells change width, so their max-pool branch needs a 1x1
    # conv + BN; stride-1 cells keep the pooled input as is.
    if cell.stride == 2:
        cell.conv1 = nn.Conv2d(in_planes, out_planes, kernel_size=1, bias=False)
        cell.bn1 = nn.BatchNorm2d(out_planes)


def _pool_branch(cell, x):
    y = F.max_pool2d(x, kernel_size=3, stride=cell.stride, padding=1)
    return cell.bn1(cell.conv1(y)) if cell.stride == 2 else y


class CellA(nn.Module):
    def __init__(self, in_planes, out_planes, stride=1):
        super().__init__()
        self.stride = stride
        self.sep_conv1 = SepConv(in_planes, out_planes, kernel_size=7, stride=stride)
        _pool_projection(self, in_planes, out_planes)

    def forward(self, x):
        return F.relu(self.sep_conv1(x) + _pool_branch(self, x))


class CellB(nn.Module):
    def __init__(self, in_planes, out_planes, stride=1):
        super().__init__()
        self.stride = stride
        # Left pair: 7x7 and 3x3; right pair: max-pool and 5x5.
        self.sep_conv1 = SepConv(in_planes, out_planes, kernel_size=7, stride=stride)
        self.sep_conv2 = SepConv(in_planes, out_planes, kernel_size=3, stride=stride)
        self.sep_conv3 = SepConv(in_planes, out_planes, kernel_size=5, stride=stride)
        _pool_projection(self, in_planes, out_planes)
        # 1x1 conv brings the two concatenated pairs back to out_planes.
        self.conv2 = nn.Conv2d(2 * out_planes, out_planes, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes)

    def forward(self, x):
        left = F.relu(self.sep_conv1(x) + self.sep_conv2(x))
        right = F.relu(_pool_branch(self, x) + self.sep_conv3(x))
        return F.relu(self.bn2(self.conv2(torch.cat([left, right], 1))))


class PNASNet(nn.Module):
    def __init__(self, cell_type, num_cells, num_planes, num_classes=10):
        super().__init__()
        self.in_planes = num_planes
        self.cell_type = cell_type
        self.conv1 = nn.Conv2d(3, num_planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(num_planes)
        self.layer1 = self._make_layer(num_planes, num_cells)
        self.layer2 = self._downsample(num_planes * 2)
        self.layer3 = self._make_layer(num_planes * 2, num_cells)
        self.layer4 = self._downsample(num_planes * 4)
        self.layer5 = self._make_layer(num_planes * 4, num_cells)
        self.linear = nn.Linear(num_planes * 4, num_classes)

    def _make_layer(self, planes, count):
        cells = []
        for _ in range(count):
            cells.append(self.cell_type(self.in_planes, planes, stride=1))
            self.in_planes = planes
        return nn.Sequential(*cells)

    def _downsample(self, planes):
        # A single cell, not a Sequential: its keys are layerN.<name>, not layerN.0.<name>.
        cell = self.cell_type(self.in_planes, planes, stride=2)
        self.in_planes = planes
        return cell

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer5(self.layer4(self.layer3(self.layer2(self.layer1(x)))))
        x = F.avg_pool2d(x, 8)  # 8x8 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))


def PNASNetA(num_classes=10):
    return PNASNet(CellA, num_cells=6, num_planes=44, num_classes=num_classes)


def PNASNetB(num_classes=10):
    return PNASNet(CellB, num_cells=6, num_planes=32, num_classes=num_classes)
