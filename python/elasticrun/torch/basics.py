"""Horovod's build and runtime introspection, answered for elasticrun: what this
installation was built with and uses. elasticrun moves host memory over UCX or shared
memory and GPU memory over NCCL; it uses neither MPI nor Gloo, nor oneCCL, ROCm or DDL.
Every function answers before init() too, as Horovod's build queries do."""
from elasticrun import _core

__all__ = ["nccl_built", "cuda_built", "rocm_built", "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled",
           "ccl_built", "ddl_built", "mpi_threads_supported", "start_timeline", "stop_timeline"]


def nccl_built():
    """The NCCL version libelasticrun was built with (NCCL_VERSION_CODE, e.g. 22807), or
    0: Horovod's answer, which scripts compare with 2700 and the like."""
    return int(_core.nccl_version())


def cuda_built():
    """Whether collectives on CUDA tensors are built in (the NCCL backend)."""
    return nccl_built() > 0


def rocm_built():
    return False


def mpi_built():
    return False


def mpi_enabled():
    return False


def gloo_built():
    return False


def gloo_enabled():
    return False


def ccl_built():
    return False


def ddl_built():
    return False


def mpi_threads_supported():
    """Horovod raises ValueError when MPI is not in use; elasticrun never uses MPI."""
    raise ValueError("elasticrun does not use MPI: mpi_threads_supported() has no answer (mpi_enabled() is False)")


def start_timeline(file_path, mark_cycles=False):
    """Horovod's timeline file is not written by elasticrun: the job's --events file and
    the driver's log record what happened instead."""
    raise NotImplementedError("elasticrun writes no Horovod timeline; use elasticrun --events FILE")


def stop_timeline():
    raise NotImplementedError("elasticrun writes no Horovod timeline; use elasticrun --events FILE")
