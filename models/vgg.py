"""VGG-11/13/16/19 with batch norm, sized for 32x32 CIFAR images.

Reference:
    Karen Simonyan, Andrew Zisserman.
    "Very Deep Convolutional Networks for Large-Scale Image Recognition". 2014.
    arXiv:1409.1556

CIFAR variant (as in kuangliu/pytorch-cifar): every 3x3 conv is followed by
BatchNorm, the five max-pools shrink 32x32 to 1x1, and the three big
fully-connected layers are replaced by one 512 -> num_classes linear layer.
"""
import torch
from torch import nn

# Layer plans from table 1 of the paper: an int is a 3x3 conv with that many
# output channels, "M" is a 2x2 max-pool.
CONFIGS = {
    "VGG11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "VGG13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "VGG16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
              512, 512, 512, "M", 512, 512, 512, "M"],
    "VGG19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
              512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


def _make_features(plan):
    stack = []
    channels = 3
    for item in plan:
        if item == "M":
            stack.append(nn.MaxPool2d(kernel_size=2, stride=2))
            continue
        # conv, bn, relu triples: their indices in `features` are part of the
        # checkpoint format (features.0.weight, features.1.running_mean, ...).
        stack += [
            nn.Conv2d(channels, item, kernel_size=3, padding=1),
            nn.BatchNorm2d(item),
            nn.ReLU(inplace=True),
        ]
        channels = item
    # kuangliu ends with a 1x1/stride-1 AvgPool2d, which is the identity; it has
    # no state and sits last, so leaving it out changes no index or output.
    return nn.Sequential(*stack)


class VGG(nn.Module):
    def __init__(self, vgg_name, num_classes=10):
        super().__init__()
        if vgg_name not in CONFIGS:
            raise ValueError(f"unknown VGG variant {vgg_name!r}; expected one of {sorted(CONFIGS)}")
        self.features = _make_features(CONFIGS[vgg_name])
        # After five 2x2 pools a 32x32 input is 512x1x1.
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.features(x)
        return self.classifier(torch.flatten(x, 1))


def VGG11(num_classes=10):
    return VGG("VGG11", num_classes)


def VGG13(num_classes=10):
    return VGG("VGG13", num_classes)


def VGG16(num_classes=10):
    return VGG("VGG16", num_classes)


def VGG19(num_classes=10):
    return VGG("VGG19", num_classes)
