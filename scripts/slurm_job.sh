#!/bin/bash
# slurm_job.sh: a pentatron training job for Slurm, 8 ranks a node, one rank per GPU
# (docs/guide.md, "Launching on a GPU cluster"). Submit it with the configuration and any overrides:
#   sbatch scripts/slurm_job.sh run.ini [--section.key=value ...]
#   sbatch --nodes=16 scripts/slurm_job.sh run.ini --parallel.dp=-1    (options on sbatch's command
#                                                                      line win over the lines below)
# srun starts the ranks through PMIx (`srun --mpi=list` shows what the site's Slurm offers);
# PT_LAUNCHER=mpirun starts them with Open MPI's mpirun instead, which reads the allocation from
# Slurm (no -np, no host list). PENTATRON is the program (default: pentatron on the PATH).
# tests/test_slurm.sh submits this file, unchanged, to a Slurm of two hosts.
#SBATCH --job-name=pentatron
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --output=pentatron-%j.out
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: sbatch slurm_job.sh CONFIG.ini [--section.key=value ...]" >&2; exit 2; }
config="$1"; shift
case "${PT_LAUNCHER:-srun}" in
  srun) exec srun --mpi=pmix "${PENTATRON:-pentatron}" train --config "$config" "$@";;
  mpirun) exec mpirun "${PENTATRON:-pentatron}" train --config "$config" "$@";;
  *) echo "slurm_job.sh: PT_LAUNCHER='$PT_LAUNCHER': want srun or mpirun" >&2; exit 2;;
esac
