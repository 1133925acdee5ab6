"""What a run tells its user: a resume says what it resumed even with progress lines off; a
diverged run ends with its one line and no NumPy warnings, and the advice in it is one the
command line accepts (hpcopt.run.nonfinite)."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest

from hpcopt.cli import main
from hpcopt.run.nonfinite import NonFiniteError, StepGuard

SMALL = ["--dataset", "digits", "--hidden", "12", "--interval", "4", "--trace-every", "4"]
SMALLER_LR = "train again with a smaller --lr (a resumed run keeps its --lr)"


def test_a_resume_says_what_it_resumed_when_its_config_has_progress_off(tmp_path, capsys):
    """Without progress lines a run still ends with its summary; a resumed run's time is all its
    jobs', and the summary says so."""
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--steps", "8", "--out", str(run), "--progress", "false"]) == 0
    trained = capsys.readouterr().out.splitlines()
    assert trained[0] == "summary" and trained[1].startswith("  test accuracy ")
    assert [line for line in trained if line.startswith("  time ")][0].endswith("% in communication")
    assert "all jobs" not in "\n".join(trained) and not [line for line in trained if line.startswith("step ")]
    assert main(["resume", str(run), "--steps", "12"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"hpcopt: resuming from {run / 'checkpoints' / 'step-000000008.h5'} at step 8 "
                      f"(run directory {run})")
    assert out[1] == "summary" and "  steps             12 per rank, 3 averaging rounds" in out
    [time_line] = [line for line in out if line.startswith("  time ")]
    assert " s (all jobs of the resumed run; this job " in time_line, time_line


def test_a_huge_lr_ends_with_one_line_and_no_numpy_warning(tmp_path, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["train", *SMALL, "--steps", "16", "--lr", "1e30", "--out", str(tmp_path / "run"),
                     "--progress", "false"])
    assert code == 3
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcopt: error: non-finite loss"), err
    assert err.rstrip().endswith(f"no checkpoint was written; {SMALLER_LR}, or with --on-nonfinite skip")


def test_the_nonfinite_advice_is_one_the_command_line_accepts(tmp_path, capsys):
    """A NaN at step 10 after the checkpoint of step 8: the line points to that checkpoint, and
    both things it says to try are accepted; a smaller --lr on resume is not (as it says)."""
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--steps", "16", "--checkpoint-every", "8", "--out", str(run),
                 "--progress", "false", "--debug-fail-at", "0:10:nan"]) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    checkpoint = run / "checkpoints" / "step-000000008.h5"
    assert err.endswith(f"the last good checkpoint is {checkpoint}; resume it with --on-nonfinite skip "
                        f"to drop the bad steps, or {SMALLER_LR}"), err
    assert main(["resume", str(checkpoint), "--lr", "0.01"]) == 2
    assert "cannot change lr when resuming" in capsys.readouterr().err
    assert main(["resume", str(checkpoint), "--on-nonfinite", "skip"]) == 0
    assert main(["train", *SMALL, "--steps", "16", "--lr", "0.01", "--out", str(tmp_path / "again"),
                 "--progress", "false"]) == 0


def _nan_row():
    return SimpleNamespace(stats=SimpleNamespace(loss_mean=math.nan), fields={"step": 12})


@pytest.mark.parametrize("checkpoint", ["", "RUN/checkpoints/step-000000008.h5"])
def test_in_skip_mode_the_advice_does_not_name_skip(checkpoint):
    guard = StepGuard("skip")
    with pytest.raises(NonFiniteError) as row_error:
        guard.check_rows([_nan_row()], 12, checkpoint, lambda: [])
    with pytest.raises(NonFiniteError) as model_error:
        guard.check_model([math.inf], 12, checkpoint)
    for error in (row_error, model_error):
        message = str(error.value)
        assert "--on-nonfinite" not in message and message.endswith(SMALLER_LR), message
        assert (checkpoint or "no checkpoint was written") in message
