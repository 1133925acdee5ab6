#!/bin/bash
#SBATCH --job-name=${name}
#SBATCH --nodes=${nodes}
#SBATCH --ntasks=${ranks}
#SBATCH --ntasks-per-node=${ranks_per_node}
#SBATCH --cpus-per-task=${cpus_per_rank}
#SBATCH --time=${time}
#SBATCH --output=logs/packed.log
#SBATCH --open-mode=append
#SBATCH --signal=B:TERM@${lead}
#SBATCH --requeue
${gpu_directives}
${directives}
# Written by hpcopt sweep (hpcopt/study/templates/packed.sh): every task of manifest.tsv as job
# steps of this one allocation of ${nodes} node(s), as many at once as its ${ranks} task slots hold
# (the arrays array-n*.sh run the same tasks one job each: same run directories, records, logs
# and resume). Submit it from the study directory:
#     cd STUDY; sbatch ${script}
set -euo pipefail
if [ ! -f manifest.tsv ]; then
    echo "${script}: submit it from its study directory (the one holding manifest.tsv)" >&2
    exit 2
fi
source "$${HPCOPT_SITE:-site.sh}"
# The stop signal before the time limit reaches this batch shell (B:), whose tasks pass it on to
# their steps; stopped at a checkpoint (exit 143), the allocation requeues itself, at most
# ${requeue} times, and finished tasks are left alone.
exec python -m hpcopt.study.pack --requeue ${requeue}
