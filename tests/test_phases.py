"""phases.py in process: --profile-steps' timer."""
from training.run.phases import PhaseTimer


def test_phase_timer_times_only_the_first_steps():
    timer = PhaseTimer(2)
    for step in range(4):
        timer.start_step(step)
        with timer.phase("forward"):
            pass
    assert len(timer.times["forward"]) == 2
    assert timer.summary().startswith("profile: median ms per step over 2 steps: forward")
