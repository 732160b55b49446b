# kube-proxy built here, with Debian's iptables (nft, as on the node), conntrack and ipset.
ARG BASE
FROM ${BASE}
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends iptables conntrack ipset kmod \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY bin/ /usr/local/bin/
