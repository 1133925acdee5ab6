"""Studies: many runs of ``hpcopt train`` that differ in a few options, run and gathered as one.

- ``spec.py``: the sweep file (``[job]``, ``[train]``, ``[sweep]``) and the tasks it makes, every
  option checked against ``hpcopt train``'s own;
- ``layout.py``: the study directory (manifest, logs, task records, run directories);
- ``sweep.py``: ``hpcopt sweep``, one Slurm or PBS job array per rank count and the manifest;
- ``task.py``: one task of the array (``python -m hpcopt.study.task INDEX LAUNCHER...``): train,
  or resume a run that holds checkpoints, or skip a finished one; ``local.py`` runs the tasks
  on this machine, K at a time (``hpcopt sweep --local -j K``);
- ``collect.py``: ``hpcopt collect``, one row per run with its state (``study.csv``, ``study.md``);
- ``export.py``: ``hpcopt export``, a trace as CSV tables or TensorBoard event files.

Nothing here imports MPI at module level: these commands run on a login node or a laptop.
"""
