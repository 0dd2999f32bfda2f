"""LeNet-5 style network for 32x32 RGB images.

Reference:
    Yann LeCun, Leon Bottou, Yoshua Bengio, Patrick Haffner.
    "Gradient-Based Learning Applied to Document Recognition".
    Proceedings of the IEEE 86(11), 1998. (Predates arXiv; no arXiv id.)

Modernised as in kuangliu/pytorch-cifar: ReLU and max-pooling instead of the
paper's scaled tanh and trainable subsampling, 3 input channels, and full
connectivity between the conv layers.
"""
import torch
from torch import nn
import torch.nn.functional as F


class LeNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        # 32 -conv5-> 28 -pool-> 14 -conv5-> 10 -pool-> 5, so 16*5*5 features.
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)
