# The kind node's base: Debian bookworm with systemd, containerd, runc and the CNI plugins from
# Debian (built by `lifeline kind build node`; kubeadm, kubelet, kubectl and the cluster's images
# are added on top by lifeline.kindbed.nodeimage). The files next to this one are ours; they say
# what each does.
ARG BASE
FROM ${BASE}
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends \
      systemd systemd-sysv dbus containerd runc containernetworking-plugins \
      iptables conntrack iproute2 ethtool kmod util-linux mount procps ca-certificates jq socat \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && systemctl mask getty.target console-getty.service systemd-binfmt.service \
      systemd-modules-load.service systemd-udevd.service systemd-remount-fs.service \
      systemd-firstboot.service sys-kernel-debug.mount sys-kernel-tracing.mount \
      sys-kernel-config.mount dev-hugepages.mount apt-daily.timer apt-daily-upgrade.timer \
      e2scrub_all.timer fstrim.timer \
 && mkdir -p /etc/kubernetes/manifests /etc/cni/net.d /kind /opt/cni \
 && ln -s /usr/lib/cni /opt/cni/bin
COPY entrypoint /usr/local/bin/entrypoint
COPY containerd.toml /etc/containerd/config.toml
COPY kubelet.service kubelet.slice /etc/systemd/system/
COPY 10-kubeadm.conf /etc/systemd/system/kubelet.service.d/10-kubeadm.conf
RUN chmod 0755 /usr/local/bin/entrypoint \
 && ctr oci spec | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \
 && systemctl enable containerd.service kubelet.service
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
