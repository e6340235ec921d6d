# One image for every zerolayer layer: the entrypoint is the `zerolayer` command, the layer is the
# first argument (`docker run zerolayer:cpu loader --address unix:/run/zerolayer/loader.sock ...`).
# compose.yaml runs the four layers from it.
#
# NOTE: Docker cannot run where this file is written, so it has never been built here;
# tests/test_compose.py checks its structure only. Keep it simple.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from the CPU-only index: `pip install .` then finds the requirement satisfied and
# does not pull the CUDA wheels (gigabytes). A CUDA image (`--device cuda`) is future work.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# Only what the package build needs: setup.py generates the gRPC code from protos/ (grpcio-tools
# in the isolated build environment) into the one installed package, zerolayer/.
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY protos/ protos/
COPY zerolayer/ zerolayer/
RUN pip install . && rm -rf /src

RUN useradd --create-home --uid 10001 zerolayer
USER zerolayer
WORKDIR /home/zerolayer

ENTRYPOINT ["zerolayer"]
CMD ["--help"]
