# The chart's in-cluster services on the Debian base (built by `lifeline kind build`, no registry):
#   --target redis : Debian's redis-server, user redis = uid 999 (the chart's pod securityContext)
#   --target minio : the MinIO binary the dev cluster builds from source (copied into the context)
ARG BASE
FROM ${BASE} AS redis
RUN groupadd --system --gid 999 redis \
 && useradd --system --uid 999 --gid 999 --home-dir /var/lib/redis --shell /usr/sbin/nologin redis \
 && apt-get update -q \
 && apt-get install -y -q --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
USER 999
CMD ["redis-server"]

FROM ${BASE} AS minio
COPY minio /usr/local/bin/minio
RUN useradd --uid 1000 --create-home minio
USER 1000
ENTRYPOINT ["/usr/local/bin/minio"]
