"""The training recipes: every hyperparameter, written down once.

RECIPE is pytorch-cifar's recipe (kuangliu), with the ports' warm-up (Goyal et al.
2017), and the default. RECIPES names it and `fast`, which trades the 200 epochs for
fewer, larger batches, and takes what published short CIFAR-10 schedules show to help
(Page 2018, "How to train your ResNet"; Jordan 2024, airbench): Nesterov momentum, a
one-cycle LR (a linear ramp to the peak, then linearly to 0, per step), label smoothing
and cutout (`--recipe fast`; its measured accuracy, and what each change gave, are in
benchmarks/results/RESULTS.md). The flags take their defaults from the chosen recipe (cli.py)
and the engine reads the rest through `of` (utils.py); nothing else writes a hyperparameter.
"""

RECIPE = dict(
    lr=0.1,               # base LR per process; SGD, stepped as lr_schedule says
    lr_schedule="cosine",  # cosine to 0 over `epochs`, stepped per epoch; or onecycle (utils.py)
    onecycle_peak=0.2,    # onecycle: the fraction of the epochs over which the LR ramps up to lr
    momentum=0.9,
    nesterov=False,
    weight_decay=5e-4,
    batch_size=128,       # images per step per process
    epochs=200,
    crop_padding=4,       # pixels of zero padding around the image before a random 32x32 crop
    cutout=0,             # side in pixels of a square zeroed at a random place in each image
    warmup_epochs=5,      # ports only: LR ramp from lr to lr * world size
    label_smoothing=0.0,  # of the training loss (the test loss is never smoothed)
)

RECIPES = {
    "pytorch-cifar": RECIPE,
    # Batch 512 keeps a GPU busier than 128; the LR is raised by 4 (linear scaling), which the
    # one-cycle ramp makes safe without a warm-up of its own.
    "fast": dict(RECIPE, lr=0.4, lr_schedule="onecycle", nesterov=True, batch_size=512, epochs=40,
                 label_smoothing=0.2, cutout=8),
}

# The flags whose defaults come from the chosen recipe (cli.py); the engine reads the rest of
# the recipe (momentum, crop padding, the one-cycle peak) through `of`.
FROM_RECIPE = ("epochs", "batch_size", "label_smoothing", "lr_schedule", "nesterov", "cutout",
               "weight_decay")


def chosen(args):
    """The recipe a run's flags chose (--recipe; its default is pytorch-cifar's)."""
    return RECIPES[args.recipe]
