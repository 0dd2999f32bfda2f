"""CIFAR-10 model zoo.

Architectures, submodule names and forward passes follow
kuangliu/pytorch-cifar, so its state_dicts load here with strict=True. Each
registry name is kuangliu's constructor name in lower case (VGG('VGG16') is
"vgg16", ShuffleNetV2(net_size=1) is "shufflenetv2"); every constructor takes
`num_classes` (default 10).

Importing this package only defines things: no printing, no downloads, no
models built.
"""
from . import (
    densenet,
    dla,
    dla_simple,
    dpn,
    efficientnet,
    googlenet,
    lenet,
    mobilenet,
    mobilenetv2,
    pnasnet,
    preact_resnet,
    regnet,
    resnet,
    resnext,
    senet,
    shufflenet,
    shufflenetv2,
    vgg,
)


def _shufflenetv2(num_classes=10):
    # kuangliu's main.py builds ShuffleNetV2 with net_size=1.
    return shufflenetv2.ShuffleNetV2(net_size=1, num_classes=num_classes)


MODELS = {
    "vgg11": vgg.VGG11,
    "vgg13": vgg.VGG13,
    "vgg16": vgg.VGG16,
    "vgg19": vgg.VGG19,
    "resnet18": resnet.ResNet18,
    "resnet34": resnet.ResNet34,
    "resnet50": resnet.ResNet50,
    "resnet101": resnet.ResNet101,
    "resnet152": resnet.ResNet152,
    "preactresnet18": preact_resnet.PreActResNet18,
    "preactresnet34": preact_resnet.PreActResNet34,
    "preactresnet50": preact_resnet.PreActResNet50,
    "preactresnet101": preact_resnet.PreActResNet101,
    "preactresnet152": preact_resnet.PreActResNet152,
    "googlenet": googlenet.GoogLeNet,
    "densenet121": densenet.DenseNet121,
    "densenet161": densenet.DenseNet161,
    "densenet169": densenet.DenseNet169,
    "densenet201": densenet.DenseNet201,
    "densenet_cifar": densenet.densenet_cifar,
    "resnext29_2x64d": resnext.ResNeXt29_2x64d,
    "resnext29_4x64d": resnext.ResNeXt29_4x64d,
    "resnext29_8x64d": resnext.ResNeXt29_8x64d,
    "resnext29_32x4d": resnext.ResNeXt29_32x4d,
    "mobilenet": mobilenet.MobileNet,
    "mobilenetv2": mobilenetv2.MobileNetV2,
    "dpn26": dpn.DPN26,
    "dpn92": dpn.DPN92,
    "shufflenetg2": shufflenet.ShuffleNetG2,
    "shufflenetg3": shufflenet.ShuffleNetG3,
    "shufflenetv2": _shufflenetv2,
    "senet18": senet.SENet18,
    "efficientnetb0": efficientnet.EfficientNetB0,
    "regnetx_200mf": regnet.RegNetX_200MF,
    "regnetx_400mf": regnet.RegNetX_400MF,
    "regnety_400mf": regnet.RegNetY_400MF,
    "simpledla": dla_simple.SimpleDLA,
    "dla": dla.DLA,
    "lenet": lenet.LeNet,
    "pnasneta": pnasnet.PNASNetA,
    "pnasnetb": pnasnet.PNASNetB,
}


class UnknownModelError(KeyError, ValueError):
    """Unknown model name. Both a KeyError (a failed registry lookup) and a
    ValueError (a bad argument), so callers may catch either."""

    def __str__(self):
        # KeyError's str() would wrap the message in quotes.
        return str(self.args[0]) if self.args else ""


def get_model(name, num_classes=10):
    """Build the registered model `name` (see MODELS) with `num_classes` outputs."""
    try:
        constructor = MODELS[name]
    except (KeyError, TypeError):  # TypeError: unhashable name
        raise UnknownModelError(
            f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}"
        ) from None
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    return constructor(num_classes=num_classes)


__all__ = ["MODELS", "UnknownModelError", "get_model"]
