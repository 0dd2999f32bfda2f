"""Lines headed by their run: what runs of one job print side by side, each line whole and
beginning with the run's name, so that the interleaved output of groups printing at once can
be told apart (main_sweep.py's runs and trials).

    with headed("lr=0.1 seed=1"):
        main(argv)          # every line it prints: "lr=0.1 seed=1 epoch 2/30 ..."
"""
import contextlib
import sys


class HeadedStream:
    """A text stream that writes each whole line to `stream` with `head` before it, at once,
    so that the lines of runs printing side by side stay whole and each names its run."""

    def __init__(self, stream, head):
        self.stream, self.head, self.part = stream, head, ""

    def write(self, text):
        lines = (self.part + text).split("\n")
        self.part = lines.pop()
        if lines:
            self.stream.write("".join(f"{self.head}{ln}\n" for ln in lines))
            self.stream.flush()
        return len(text)

    def flush(self):
        self.stream.flush()

    def isatty(self):
        return False  # no progress bar redrawn over other runs' lines


@contextlib.contextmanager
def headed(head):
    """Every line printed to stdout or stderr in the block begins with `head`."""
    out, err = HeadedStream(sys.stdout, head + " "), HeadedStream(sys.stderr, head + " ")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        for s in (out, err):
            if s.part:
                s.write("\n")
