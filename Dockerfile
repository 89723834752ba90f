# The trainer side of a GPU run: controller, gateway, sandboxed agents and trainer ranks, on the
# CUDA build of torch that the base image ships. Inference servers (SGLang, vLLM) run from their
# own images or venvs; see docs/gpu.md.
#
#   docker build -t areal-lite .
#   docker run --gpus all --privileged --network host -v /models:/models -v /data:/data \
#       areal-lite python -m areal.train model.path=/models/Qwen3-1.7B data.train=/data/train.parquet ...
#
# --privileged: the sandbox makes network, PID and mount namespaces and cgroups for each episode.
ARG BASE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
FROM ${BASE}

# gcc for the optional C ring writer; node/npm for agents written in JavaScript (exec: agents).
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential nodejs npm \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/areal-lite
COPY requirements.lock constraints.txt pyproject.toml setup.py README.md ./
COPY areal areal
COPY conf conf
COPY sandbox sandbox
COPY agents agents
COPY examples examples

# The image's torch stays: pin it to the installed version so the lock installs around it.
RUN python -c "import torch; print(f'torch=={torch.__version__}')" > /tmp/torch.txt \
 && pip install --no-cache-dir -r requirements.lock -c /tmp/torch.txt \
 && pip install --no-cache-dir --no-deps . \
 && pip check \
 && python -m areal.train --help > /dev/null

ENV HF_HUB_OFFLINE=1
CMD ["python", "-m", "areal.train", "--help"]
