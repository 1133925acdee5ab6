# Site file: sourced by every generated job script before hpcopt starts.
# Put your cluster's module loads and MPI environment here (or point HPCOPT_SITE at your own
# copy). Nothing site-specific belongs in the templates.
#
# Examples (uncomment and adapt):
#   module load python/3.11 openmpi/4.1 cuda/12
#   source "$HOME/venvs/hpcopt/bin/activate"
#   export HPCOPT_GPU_AWARE_MPI=1          # only if your MPI is CUDA-aware
#   export OMPI_MCA_btl=^openib            # Open MPI transport choices
: # nothing to do by default
