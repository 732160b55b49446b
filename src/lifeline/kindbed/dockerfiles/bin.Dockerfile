# A cluster component from a binary built here (kube-apiserver, kube-controller-manager,
# kube-scheduler, etcd): bin/ of the context into /usr/local/bin (kubeadm's static pods run
# them by name). Built by `lifeline kind build node`.
ARG BASE
FROM ${BASE}
COPY bin/ /usr/local/bin/
