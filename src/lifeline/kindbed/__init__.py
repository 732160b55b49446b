"""The kind test bed: real nodes (kind, built from source), real containers, images built here.

``lifeline kind build`` builds the Debian base (debootstrap), the Lifeline image (every role),
Redis and MinIO images and the kind node image (kubelet, kubeadm, kubectl, control-plane
component images, CoreDNS, pause, all from source); ``lifeline kind up`` creates the cluster of
``kind-config.yaml``; ``lifeline kind install`` installs the chart. docs/kind.md has the details.

Modules: ``engine`` (Docker installed/started), ``gobuild`` (Go builds on the dev cluster's
cache), ``images`` (base, Lifeline, Redis, MinIO), ``nodeimage`` (the node image),
``cluster`` (``KindCluster``), ``cni`` (pod networking), ``chart`` (helm install), ``cli``.
"""
