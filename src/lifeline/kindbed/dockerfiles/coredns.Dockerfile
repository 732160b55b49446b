# CoreDNS built here, at /coredns: the entrypoint kubeadm's CoreDNS Deployment expects.
ARG BASE
FROM ${BASE}
COPY bin/coredns /coredns
ENTRYPOINT ["/coredns"]
