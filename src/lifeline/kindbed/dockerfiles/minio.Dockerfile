# The chart's in-cluster MinIO: the binary the dev cluster builds from source (in the context).
ARG BASE
FROM ${BASE}
COPY minio /usr/local/bin/minio
RUN useradd --uid 1000 --create-home minio
USER 1000
ENTRYPOINT ["/usr/local/bin/minio"]
