# The Lifeline image: one image for every role (`python -m lifeline <role>`: operator, sidecar,
# trainer). Python 3.11 from Debian bookworm, torch for CPU, the package. It builds without PyPI
# (pip reads only the context: --no-index; apt fetches python3 from Debian) from a context that
# `lifeline kind build lifeline` assembles:
#   deps/      the wheels of every dependency, pinned by pip's resolution of pyproject.toml at
#              the test venv's versions (downloaded once into ~/.cache/lifeline/wheels); torch's
#              CUDA runtime is replaced by link stubs (slim_torch.py, docs/kind.md)
#   lifeline/  the wheel of this package
#   slim_torch.py
# BASE is the Debian image built by debootstrap (`lifeline kind build base`).
ARG BASE
FROM ${BASE} AS python
# every stage carries it: `lifeline kind build` removes the untagged stages it leaves behind
LABEL dev.lifeline.image=lifeline
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && useradd --uid 1000 --create-home lifeline
ENV PATH=/opt/lifeline/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# The dependencies, installed in a stage of their own: the wheels never reach the final image.
FROM python AS deps
RUN apt-get update -q && apt-get install -y -q --no-install-recommends gcc binutils
COPY deps/ /tmp/deps/
COPY slim_torch.py /tmp/slim_torch.py
RUN python3 -m venv /opt/lifeline \
 && pip install --no-index --no-deps --no-compile -q /tmp/deps/*.whl \
 && python /tmp/slim_torch.py /opt/lifeline

FROM python
COPY --from=deps /opt/lifeline /opt/lifeline
# the chart runs the operator as uid 65532: kopf names itself after the user (getpass.getuser())
RUN useradd --uid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY lifeline/ /tmp/lifeline/
RUN pip install --no-index --no-deps --no-compile -q /tmp/lifeline/*.whl && rm -rf /tmp/lifeline /root/.cache
USER 1000
WORKDIR /home/lifeline
ENTRYPOINT ["python", "-m", "lifeline"]
CMD ["operator"]
