# The chart's in-cluster Redis: Debian's redis-server on the Debian base, user redis = uid 999
# (the chart's pod securityContext). Built by `lifeline kind build services`.
ARG BASE
FROM ${BASE}
RUN groupadd --system --gid 999 redis \
 && useradd --system --uid 999 --gid 999 --home-dir /var/lib/redis --shell /usr/sbin/nologin redis \
 && apt-get update -q \
 && apt-get install -y -q --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
USER 999
CMD ["redis-server"]
