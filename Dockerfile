# tfhvd with GPU collectives: CUDA 12 + cuDNN, OpenMPI, NCCL, TensorFlow and
# mpi4py, and tfhvd built with TFHVD_GPU_OPERATIONS=NCCL (and OpenSSL's
# libcrypto from libssl-dev, which signs and checks a job's requests:
# docs/security.md).
#
#   docker build -t tfhvd:gpu .
#   docker run --gpus all --rm tfhvd:gpu          # prints the --check-build report
#
# Every version is an ARG (defaults: docker/versions.env).  The install steps
# are the scripts in docker/, which `make test` also runs on a CPU machine.
ARG CUDA_VERSION=12.5.1
ARG UBUNTU_VERSION=22.04
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu${UBUNTU_VERSION}

ARG OPENMPI_VERSION=
ARG TF_VERSION=2.21.0
ARG MPI4PY_VERSION=4.1.2
ARG NCCL_VERSION=2.27.7
ARG TFHVD_CUDA_ARCHS="70;75;80;86;89;90;100;120"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV TFHVD_VENV=/opt/tfhvd/venv \
    PYTHON=/opt/tfhvd/venv/bin/python \
    PATH=/opt/tfhvd/venv/bin:${PATH} \
    TFHVD_CUDA_HOME=/usr/local/cuda \
    OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    TF_CPP_MIN_LOG_LEVEL=2
WORKDIR /opt/tfhvd/src

COPY docker/ docker/
RUN OPENMPI_VERSION="${OPENMPI_VERSION}" PYTHON=python3 docker/install_system.sh \
 && TF_VERSION="${TF_VERSION}" MPI4PY_VERSION="${MPI4PY_VERSION}" TFHVD_GPU=1 \
    PYTHON=python3 docker/install_python_deps.sh \
 && NCCL_VERSION="${NCCL_VERSION}" docker/install_gpu_wheels.sh

COPY . .
RUN TFHVD_GPU_OPERATIONS=NCCL TFHVD_CUDA_ARCHS="${TFHVD_CUDA_ARCHS}" docker/build_tfhvd.sh \
 && docker/check_image.sh

WORKDIR /workspace
CMD ["python", "-m", "tfhvd.runner", "--check-build"]
