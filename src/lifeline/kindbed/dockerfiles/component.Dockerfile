# Images of the cluster's own components, from binaries built here (`lifeline kind build node`);
# the build context holds bin/ with the binaries of one target.
#   plain      : kube-apiserver, kube-controller-manager, kube-scheduler, etcd (in /usr/local/bin:
#                kubeadm's static pods run them by name)
#   kube-proxy : kube-proxy with Debian's iptables (nft, as on the node) and conntrack
#   coredns    : /coredns, the entrypoint kubeadm's CoreDNS Deployment expects
#   pause      : the pod sandbox, a static binary and nothing else
ARG BASE
FROM ${BASE} AS plain
COPY bin/ /usr/local/bin/

FROM ${BASE} AS kube-proxy
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends iptables conntrack ipset kmod \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY bin/ /usr/local/bin/

FROM ${BASE} AS coredns
COPY bin/coredns /coredns
ENTRYPOINT ["/coredns"]

FROM scratch AS pause
COPY bin/pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
