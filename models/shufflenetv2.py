"""ShuffleNet V2 (net sizes 0.5, 1, 1.5, 2) for 32x32 CIFAR images.

Reference:
    Ningning Ma, Xiangyu Zhang, Hai-Tao Zheng, Jian Sun.
    "ShuffleNet V2: Practical Guidelines for Efficient CNN Architecture Design". 2018.
    arXiv:1807.11164

Basic units split the channels in half, transform one half and shuffle the
halves back together; down-sampling units run both halves through stride-2
branches. CIFAR variant (as in kuangliu/pytorch-cifar): 3x3 stride-1 stem and
no max-pool, so the three stages run at 16, 8 and 4 pixels.
"""
import torch
from torch import nn
import torch.nn.functional as F

# Channel widths (three stages + final 1x1 conv) and units per stage, table 5.
configs = {
    0.5: {"out_channels": (48, 96, 192, 1024), "num_blocks": (3, 7, 3)},
    1: {"out_channels": (116, 232, 464, 1024), "num_blocks": (3, 7, 3)},
    1.5: {"out_channels": (176, 352, 704, 1024), "num_blocks": (3, 7, 3)},
    2: {"out_channels": (224, 488, 976, 2048), "num_blocks": (3, 7, 3)},
}


class ShuffleBlock(nn.Module):
    """Channel shuffle: interleave the channels of `groups` equal groups."""

    def __init__(self, groups=2):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        n, c, h, w = x.shape
        return x.view(n, self.groups, c // self.groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class SplitBlock(nn.Module):
    """Split channels into the first `ratio` part and the rest."""

    def __init__(self, ratio):
        super().__init__()
        self.ratio = ratio

    def forward(self, x):
        c = int(x.size(1) * self.ratio)
        return x[:, :c], x[:, c:]


class BasicBlock(nn.Module):
    def __init__(self, in_channels, split_ratio=0.5):
        super().__init__()
        self.split = SplitBlock(split_ratio)
        c = int(in_channels * split_ratio)
        self.conv1 = nn.Conv2d(c, c, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, kernel_size=3, stride=1, padding=1, groups=c, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.Conv2d(c, c, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.shuffle = ShuffleBlock()

    def forward(self, x):
        keep, work = self.split(x)
        y = F.relu(self.bn1(self.conv1(work)))
        y = self.bn2(self.conv2(y))  # no ReLU after the depthwise conv (paper, fig. 3)
        y = F.relu(self.bn3(self.conv3(y)))
        return self.shuffle(torch.cat([keep, y], 1))


class DownBlock(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        mid = out_channels // 2
        # Left branch: depthwise stride-2 conv, then 1x1.
        self.conv1 = nn.Conv2d(in_channels, in_channels, kernel_size=3, stride=2, padding=1,
                               groups=in_channels, bias=False)
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv2 = nn.Conv2d(in_channels, mid, kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        # Right branch: 1x1, depthwise stride-2 conv, 1x1.
        self.conv3 = nn.Conv2d(in_channels, mid, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(mid)
        self.conv4 = nn.Conv2d(mid, mid, kernel_size=3, stride=2, padding=1, groups=mid, bias=False)
        self.bn4 = nn.BatchNorm2d(mid)
        self.conv5 = nn.Conv2d(mid, mid, kernel_size=1, bias=False)
        self.bn5 = nn.BatchNorm2d(mid)
        self.shuffle = ShuffleBlock()

    def forward(self, x):
        left = self.bn1(self.conv1(x))
        left = F.relu(self.bn2(self.conv2(left)))
        right = F.relu(self.bn3(self.conv3(x)))
        right = self.bn4(self.conv4(right))
        right = F.relu(self.bn5(self.conv5(right)))
        return self.shuffle(torch.cat([left, right], 1))


class ShuffleNetV2(nn.Module):
    def __init__(self, net_size=1, num_classes=10):
        super().__init__()
        if net_size not in configs:
            raise ValueError(f"unknown ShuffleNetV2 net_size {net_size!r}; "
                             f"expected one of {sorted(configs)}")
        out_channels = configs[net_size]["out_channels"]
        num_blocks = configs[net_size]["num_blocks"]
        self.conv1 = nn.Conv2d(3, 24, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(24)
        self.in_channels = 24
        self.layer1 = self._make_layer(out_channels[0], num_blocks[0])
        self.layer2 = self._make_layer(out_channels[1], num_blocks[1])
        self.layer3 = self._make_layer(out_channels[2], num_blocks[2])
        self.conv2 = nn.Conv2d(out_channels[2], out_channels[3], kernel_size=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels[3])
        self.linear = nn.Linear(out_channels[3], num_classes)

    def _make_layer(self, out_channels, count):
        # One down-sampling unit followed by `count` basic units.
        units = [DownBlock(self.in_channels, out_channels)]
        units += [BasicBlock(out_channels) for _ in range(count)]
        self.in_channels = out_channels
        return nn.Sequential(*units)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.avg_pool2d(x, 4)  # 4x4 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))
