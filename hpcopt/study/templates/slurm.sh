#!/bin/bash
#SBATCH --job-name=${name}
#SBATCH --array=${array}
#SBATCH --nodes=${nodes}
#SBATCH --ntasks=${ranks}
#SBATCH --ntasks-per-node=${ranks_per_node}
#SBATCH --cpus-per-task=${cpus_per_rank}
#SBATCH --time=${time}
#SBATCH --output=logs/task-%a.log
#SBATCH --open-mode=append
#SBATCH --signal=TERM@${lead}
#SBATCH --requeue
${gpu_directives}
${directives}
# Written by hpcopt sweep (hpcopt/study/templates/slurm.sh): the study's tasks on ${ranks} rank(s),
# tasks ${first} to ${last} of manifest.tsv. Submit it from the study directory:
#     cd STUDY; sbatch ${script}
# Every path here is relative to that directory, so a study can be moved. Site specifics
# (modules, MPI environment) belong in the site file; the account, partition, QoS and memory
# in the sweep file's [job] table.
set -euo pipefail
if [ ! -f manifest.tsv ]; then
    echo "${script}: submit it from its study directory (the one holding manifest.tsv)" >&2
    exit 2
fi
source "$${HPCOPT_SITE:-site.sh}"
# Task i trains with its line of manifest.tsv; a run directory that holds checkpoints (a requeued
# or resubmitted task) is resumed, a finished one is left as it is. A task stopped at a
# checkpoint (exit 143: its time limit, preemption, scancel --signal) requeues itself, at most
# ${requeue} times; the log keeps every attempt. A stop signal sent to this batch shell
# (scancel --batch) is passed on to srun.
exec python -m hpcopt.study.task "$${SLURM_ARRAY_TASK_ID}" --requeue ${requeue} srun ${launcher_flags}
