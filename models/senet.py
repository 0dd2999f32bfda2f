"""SENet-18: a pre-activation ResNet-18 with squeeze-and-excitation, for CIFAR.

Reference:
    Jie Hu, Li Shen, Samuel Albanie, Gang Sun, Enhua Wu.
    "Squeeze-and-Excitation Networks". 2017.
    arXiv:1709.01507

Each residual branch is rescaled channel-wise by a gate computed from its own
global average (squeeze), a 1/16 bottleneck and a sigmoid (excitation). As in
kuangliu/pytorch-cifar the gate's two layers are 1x1 convs with bias (`fc1`,
`fc2`) and the blocks are pre-activation blocks.
"""
import torch
from torch import nn
import torch.nn.functional as F


class PreActBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1,
                               bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        if stride != 1 or in_planes != planes:
            # Attribute only exists when projecting (kuangliu's layout).
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False)
            )
        # Squeeze-excitation gate with reduction ratio 16.
        self.fc1 = nn.Conv2d(planes, planes // 16, kernel_size=1)
        self.fc2 = nn.Conv2d(planes // 16, planes, kernel_size=1)

    def forward(self, x):
        pre = F.relu(self.bn1(x))
        skip = self.shortcut(pre) if hasattr(self, "shortcut") else x
        y = self.conv1(pre)
        y = self.conv2(F.relu(self.bn2(y)))
        gate = F.adaptive_avg_pool2d(y, 1)
        gate = torch.sigmoid(self.fc2(F.relu(self.fc1(gate))))
        return y * gate + skip


class SENet(nn.Module):
    def __init__(self, block, num_blocks, num_classes=10):
        super().__init__()
        self.in_planes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = self._make_layer(block, 64, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, 128, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, 256, num_blocks[2], stride=2)
        self.layer4 = self._make_layer(block, 512, num_blocks[3], stride=2)
        self.linear = nn.Linear(512, num_classes)

    def _make_layer(self, block, planes, count, stride):
        blocks = []
        for s in [stride] + [1] * (count - 1):
            blocks.append(block(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*blocks)

    def forward(self, x):
        # kuangliu applies BN+ReLU to the stem even though the first
        # pre-activation block normalises again; kept for weight compatibility.
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.avg_pool2d(x, 4)  # 4x4 map for a 32x32 input: global pool
        return self.linear(torch.flatten(x, 1))


def SENet18(num_classes=10):
    return SENet(PreActBlock, [2, 2, 2, 2], num_classes)
