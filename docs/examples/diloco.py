"""The worked example of "Adding an algorithm" (docs/python.md): DiLoCo, a preset of PR-SGD.

    mpiexec -n 2 python docs/examples/diloco.py

``hpcopt/algorithms/diloco.py`` is a frozen dataclass with a ``name`` that subclasses PR-SGD
(``LocalSGD``) and redeclares six options with DiLoCo's defaults. This script checks what that
buys: the registry finds it, its state is PR-SGD's ``DataParallelState`` with the fields its
pieces declare (AdamW's moments, the Nesterov outer optimizer's anchor and buffer; the field
kinds say what a checkpoint holds), and ``--algorithm diloco`` trains the same model, bit for bit, as
``--algorithm prsgd`` given DiLoCo's options.
"""

import numpy as np
from mpi4py import MPI

import hpcopt
from hpcopt.algorithms import LocalSGD, option_fields, registry
from hpcopt.algorithms import state as kinds

show = print if MPI.COMM_WORLD.Get_rank() == 0 else (lambda *_: None)
diloco = registry()["diloco"]
assert issubclass(diloco, LocalSGD)
prsgd_defaults = {f.name: f.default for f in option_fields(LocalSGD)}
own = {f.name: f.default for f in option_fields(diloco) if f.default != prsgd_defaults[f.name]}
show("diloco's own defaults:", own)
run = {"dataset": "digits", "hidden": "16", "steps": "20", "interval": "5", "dtype": "float64"}
preset, preset_state = hpcopt.train(hpcopt.build_config(None, {**run, "algorithm": "diloco"}),
                                    verbose=False)
spelled = {key: str(value) for key, value in own.items()}
by_hand, by_hand_state = hpcopt.train(
    hpcopt.build_config(None, {**run, "algorithm": "prsgd", **spelled}), verbose=False)
assert np.array_equal(preset_state.x, by_hand_state.x), "the preset and its options differ"
show("what a checkpoint holds of its state:", {kind: kinds.fields_of(preset_state, kind)
                                              for kind in (kinds.MODEL, kinds.VECTOR, kinds.SHARED,
                                                           kinds.COUNTER)})
show(f"diloco = prsgd with its options, bit for bit: {preset.lines()[0]}")
