#!/bin/bash
#PBS -N ${name}
#PBS -J ${array}
#PBS -l select=${nodes}:ncpus=${cpus_per_node}:mpiprocs=${ranks_per_node}${pbs_gpus}${pbs_memory}
#PBS -l walltime=${time}
#PBS -j oe
#PBS -o logs/task-^array_index^.log
${pbs_throttle}
${directives}
# Written by hpcopt sweep (hpcopt/study/templates/pbs.sh): the study's tasks on ${ranks} rank(s),
# tasks ${first} to ${last} of manifest.tsv. Submit it from the study directory:
#     cd STUDY; qsub ${script}
# Every path here is relative to that directory, so a study can be moved. Site specifics
# (modules, MPI environment) belong in the site file, which also activates the Python
# environment hpcopt sweep ran in (PBS does not pass the submitting shell's on); the account,
# queue and memory in the sweep file's [job] table. Untested against a real PBS server.
set -euo pipefail
cd "$${PBS_O_WORKDIR:-.}"
if [ ! -f manifest.tsv ]; then
    echo "${script}: submit it from its study directory (the one holding manifest.tsv)" >&2
    exit 2
fi
source "$${HPCOPT_SITE:-site.sh}"
# Task i trains with its line of manifest.tsv; a run directory that holds checkpoints (a requeued
# or resubmitted task) is resumed, a finished one is left as it is.
exec python -m hpcopt.study.task "$${PBS_ARRAY_INDEX}" mpiexec -n ${ranks} ${launcher_flags}
