"""The training recipes: every hyperparameter, written down once.

RECIPE is pytorch-cifar's recipe (kuangliu), with the ports' warm-up (Goyal et al.
2017), and the default. RECIPES names it and `fast`, which trades the 200 epochs for
fewer, larger batches and label smoothing (`--recipe fast`; its measured accuracy is in
benchmarks/RESULTS.md). The flags take their defaults from the chosen recipe (cli.py)
and the engine reads the rest (utils.py); nothing else writes a hyperparameter.
"""

RECIPE = dict(
    lr=0.1,               # base LR per process; SGD, cosine to 0 over `epochs`, stepped per epoch
    momentum=0.9,
    weight_decay=5e-4,
    batch_size=128,       # images per step per process
    epochs=200,
    crop_padding=4,       # pixels of zero padding around the image before a random 32x32 crop
    warmup_epochs=5,      # ports only: LR ramp from lr to lr * world size
    label_smoothing=0.0,  # of the training loss (the test loss is never smoothed)
)

RECIPES = {
    "pytorch-cifar": RECIPE,
    # Batch 512 runs the GPU 2-3x faster per image than 128; the LR is raised by sqrt(4).
    "fast": dict(RECIPE, lr=0.2, batch_size=512, epochs=50, label_smoothing=0.1),
}


def of(args):
    """The recipe a run's flags chose (pytorch-cifar's where none is named)."""
    return RECIPES[getattr(args, "recipe", None) or "pytorch-cifar"]
