"""headed.py: lines printed in the block begin with the run's head, each written whole."""
import io
import sys

from sweeps.headed import HeadedStream, headed


def test_every_line_is_written_whole_with_its_head():
    out = io.StringIO()
    s = HeadedStream(out, "trial 3 ")
    s.write("epoch 1/2 ")
    assert out.getvalue() == ""  # half a line waits for its end
    s.write("acc 0.5\nepoch 2")
    s.write("/2 acc 0.6\n\n")
    assert out.getvalue() == "trial 3 epoch 1/2 acc 0.5\ntrial 3 epoch 2/2 acc 0.6\ntrial 3 \n"
    assert not s.isatty()  # no progress bar redrawn over the lines of other runs


def test_headed_covers_stdout_and_stderr_and_ends_a_last_half_line(capsys):
    with headed("lr=0.1 seed=1"):
        print("epoch 1/2")
        print("warning", file=sys.stderr)
        sys.stdout.write("no newline")
    print("after")
    got = capsys.readouterr()
    assert got.out == "lr=0.1 seed=1 epoch 1/2\nlr=0.1 seed=1 no newline\nafter\n"
    assert got.err == "lr=0.1 seed=1 warning\n"
