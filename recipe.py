"""The training recipe: every hyperparameter, written down once.

pytorch-cifar's recipe (kuangliu), with the ports' warm-up (Goyal et al. 2017). The
flags take their defaults from here (cli.py) and the engine reads the rest
(utils.py); nothing else writes a hyperparameter.
"""

RECIPE = dict(
    lr=0.1,               # base LR per process; SGD, cosine to 0 over `epochs`, stepped per epoch
    momentum=0.9,
    weight_decay=5e-4,
    batch_size=128,       # images per step per process
    epochs=200,
    crop_padding=4,       # pixels of zero padding around the image before a random 32x32 crop
    warmup_epochs=5,      # ports only: LR ramp from lr to lr * world size
)
