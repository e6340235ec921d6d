# One image for every zerolayer layer: the entrypoint is the `zerolayer` command, the layer is the
# first argument (`docker run zerolayer:cpu loader --address unix:/run/zerolayer/loader.sock ...`).
# compose.yaml runs the four layers from it.
#
# NOTE: Docker cannot run where this file is written, so it has never been built here;
# tests/test_compose.py checks it against the repository (what it copies exists and passes
# .dockerignore, the native kernels' sources are where the package looks for them, a compiler is
# installed and the kernels are built into the image). Keep it simple.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The native CPU kernels (csrc/) are C++: g++ compiles them when the package is installed below.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

# torch first, from the CPU-only index: `pip install` then finds the requirement satisfied and
# does not pull the CUDA wheels (gigabytes). A CUDA image (`--device cuda`) is future work.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# What the package build needs (setup.py generates the gRPC code from protos/ into zerolayer/ and
# compiles csrc/ into zerolayer/scheduler/model/native/prebuilt/). Editable, as CI installs it:
# the scheduler checks the library against csrc/ beside the zerolayer/ package.
WORKDIR /opt/zerolayer
COPY pyproject.toml setup.py README.md ./
COPY protos/ protos/
COPY csrc/ csrc/
COPY zerolayer/ zerolayer/
RUN pip install -e .

RUN useradd --create-home --uid 10001 zerolayer

# The kernels are in the image, built by the install above (readable by every user; the
# containers' caches are not kept). This makes sure: it returns at once when they are there.
RUN python -m zerolayer.scheduler.model.native.build --prebuilt

USER zerolayer
WORKDIR /home/zerolayer

ENTRYPOINT ["zerolayer"]
CMD ["--help"]
