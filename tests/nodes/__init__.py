"""Jobs on several nodes emulated on one machine (hydra's host list; MPICH only)."""
