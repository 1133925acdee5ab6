"""hpcopt.torch.text and models.word_lstm: windows of a token stream, the tied word LSTM's
gradient through hpcopt is torch's own, evaluation in perplexity, and a short CELGC run."""

import copy
import math

import numpy as np
import pytest

pytestmark = pytest.mark.extra
torch = pytest.importorskip("torch")

from hpcopt.config import build_config  # noqa: E402
from hpcopt.torch import evaluate_tokens, language_workload  # noqa: E402
from hpcopt.torch.models import WordLSTM, word_lstm  # noqa: E402
from hpcopt.torch.text import sequence_loss, windows  # noqa: E402

VOCAB, BPTT = 13, 5


def tokens(n, seed=0):
    """A learnable stream: mostly token (t + 1) % VOCAB after t, sometimes a random one."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    for i in range(1, n):
        out[i] = (out[i - 1] + 1) % VOCAB if rng.random() < 0.8 else rng.integers(VOCAB)
    return out


def factory():
    return word_lstm(VOCAB, embedding=8, hidden=8)


def test_windows_cut_the_stream_and_shift_the_targets_by_one():
    inputs, targets = windows(np.arange(12), 5)
    assert inputs.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert targets.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert windows(np.arange(11), 5)[0].shape == (2, 5)
    assert windows(np.arange(10), 5)[0].shape == (1, 5)  # the last window needs its next token
    with pytest.raises(ValueError):
        windows(np.arange(5), 5)


def test_tied_decoder_is_one_parameter_and_untied_needs_equal_sizes():
    model = word_lstm(VOCAB, embedding=8, hidden=8)
    assert model.decoder.weight is model.embedding.weight
    assert len(list(model.parameters())) == 1 + 4 + 1  # embedding, LSTM's four, decoder bias
    assert word_lstm(VOCAB, 8, 6, tied=False).decoder.weight.shape == (VOCAB, 6)
    with pytest.raises(ValueError):
        WordLSTM(VOCAB, 8, 6)


def test_oracle_gradient_of_the_tied_word_lstm_is_torch_autograd_gradient(comm):
    run = language_workload(factory, tokens(400), tokens(100, 1), comm, bptt=BPTT, batch_size=4,
                            seed=2, dtype="float64")
    reference = copy.deepcopy(run.problem.model.module)
    grads = np.full_like(run.x0, np.nan)
    state = run.problem.sampler.state()
    loss = run.problem.oracle(run.x0, grads)
    run.problem.sampler.restore(state)
    inputs, targets = run.problem.batches.next_batch()
    expected = sequence_loss(reference(inputs), targets)
    expected.backward()
    flat = torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).numpy()
    assert run.layout.size == flat.size  # the tied weight once
    np.testing.assert_array_equal(grads, flat)
    assert float(loss) == expected.item()


def test_evaluation_is_the_mean_token_cross_entropy_as_perplexity(comm):
    valid, test = tokens(101, 1), tokens(66, 2)
    run = language_workload(factory, tokens(400), valid, comm, bptt=BPTT, batch_size=4, seed=0,
                            dtype="float64", eval_chunk=3)
    module = copy.deepcopy(run.problem.model.module).eval()
    for split, evaluation in ((valid, run.evaluate(run.x0, None, comm)),
                              (test, evaluate_tokens(run, run.x0, test, comm, bptt=BPTT, chunk=4))):
        inputs, targets = windows(split, BPTT)
        with torch.no_grad():
            expected = sequence_loss(module(inputs), targets).item()
        assert evaluation.tokens == inputs.numel()
        assert evaluation.loss == pytest.approx(expected, rel=1e-12)
        assert evaluation.perplexity == pytest.approx(math.exp(expected), rel=1e-12)


def test_celgc_trains_the_word_lstm_through_hpcopt_train(comm):
    import hpcopt

    run = language_workload(factory, tokens(2000), tokens(300, 1), comm, bptt=BPTT, batch_size=8,
                            seed=0, dtype="float32")
    before = run.evaluate(run.x0, None, comm).perplexity
    config = build_config(None, {"algorithm": "celgc", "interval": "4", "lr": "5", "gamma": "1.25",
                                 "steps": "120", "progress": "false", "trace": "false"})
    summary, _ = hpcopt.train(config, comm, verbose=False, workload=run)
    assert summary.unit == "tokens" and summary.clip_fraction is not None
    assert summary.final.perplexity < 0.5 * before < VOCAB


def test_the_command_line_trains_a_torch_language_model_on_a_corpus(tmp_path):
    """``--model torch:...`` on a text corpus: the factory gets the vocabulary size, the run
    trains on windows of bptt tokens and reports perplexity on the test split."""
    from hpcopt.comm import Comm
    from hpcopt.data.text import load_corpus
    from hpcopt.run import train

    options = {"model": "torch:tests.torch_models:tiny_lm", "dataset": "shakespeare", "steps": "4",
               "corpus_fraction": "0.002", "batch_size": "4", "bptt": "8", "interval": "2",
               "progress": "false"}
    summary, state = train(build_config(None, options), Comm(), verbose=False)
    vocab = load_corpus("shakespeare").vocab_size
    assert state.x.size == vocab * 8 + 8 * vocab + vocab  # tiny_lm(vocab): embedding, linear
    assert summary.unit == "tokens" and summary.steps == 4
    assert math.isfinite(summary.final.perplexity) and summary.final.perplexity < 2 * vocab


@pytest.mark.parametrize("overrides,match", [
    ({"partition": "dirichlet", "alpha": "0.5"}, "sharded iid or block, not dirichlet"),
    ({"model": "torch:tests.torch_models:bn_cnn"}, "takes the vocabulary size as its one argument"),
])
def test_a_torch_language_model_that_cannot_train_is_one_error(overrides, match):
    from hpcopt.comm import Comm
    from hpcopt.errors import HpcoptError
    from hpcopt.run import train

    options = {"model": "torch:tests.torch_models:tiny_lm", "dataset": "ptb", "steps": "2",
               "corpus_fraction": "0.01", "batch_size": "4", "bptt": "8", "progress": "false",
               **overrides}
    with pytest.raises(HpcoptError, match=match):
        train(build_config(None, options), Comm(), verbose=False)
