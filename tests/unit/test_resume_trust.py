"""Resuming trusts no path or module a checkpoint names: a torch model is imported only when the
user names it again, and pruning deletes only the run's own checkpoints (in process, 1 rank)."""

from __future__ import annotations

import dataclasses

import pytest

from hpcopt.io.data_parallel_checkpoint import write_checkpoint
from hpcopt.run.directory import prune
from tests.unit.test_checkpoint import synthetic


def test_prune_deletes_only_this_runs_own_checkpoints(tmp_path):
    for tick, run_id in ((4, "abc"), (6, "xyz"), (8, "abc"), (12, "abc")):
        write_checkpoint(tmp_path / f"step-{tick:09d}.h5", dataclasses.replace(synthetic(), run_id=run_id))
    (tmp_path / "step-000000010.h5").write_bytes(b"not HDF5: whose it is cannot be read")
    prune(tmp_path, keep=1, run_id="abc")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000006.h5", "step-000000010.h5", "step-000000012.h5"]


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.extra
def test_a_torch_run_resumes_only_with_its_model_named_again(tmp_path, capsys):
    pytest.importorskip("torch")
    from hpcopt.cli import main

    run, spec = tmp_path / "run", "torch:tests.torch_models:bn_cnn"
    common = ["--steps", "8", "--progress", "false"]
    assert main(["train", "--model", spec, "--dataset", "digits", "--batch-size", "8",
                 "--checkpoint-every", "4", *common, "--out", str(run)]) == 0
    (run / "checkpoints" / "step-000000008.h5").unlink()
    capsys.readouterr()
    assert main(["resume", str(run), *common]) == 2
    (line,) = _errors(capsys)
    assert "--model: the checkpoint's model is a torch module" in line and f'"{spec}"' in line
    assert main(["resume", str(run), *common, "--model", "torch:tests.torch_models:not_a_module"]) == 2
    (line,) = _errors(capsys)
    assert "cannot change model when resuming" in line
    mine = tmp_path / "mine.toml"
    mine.write_text(f'[model]\nmodel = "{spec}"\n')  # the user's own --config names it
    assert main(["resume", str(run), *common, "--config", str(mine)]) == 0
    assert (run / "checkpoints" / "step-000000008.h5").is_file()



def test_resume_help_states_where_a_resumed_run_writes_and_what_it_imports(capsys):
    from hpcopt.cli import make_parser

    with pytest.raises(SystemExit):
        make_parser().parse_args(["resume", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for rule in ("the out stored in a checkpoint is never used", "--out DIR", "holds one run",
                 "OUT/hpcopt.lock", "--model torch:MODULE:FUNCTION"):
        assert rule in text, rule
