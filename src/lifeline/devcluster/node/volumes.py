"""Materialise a pod's volumes and containers' environments on the local filesystem.

Processes share one filesystem, so each volume becomes a directory under the pod's
directory (``Memory``-medium emptyDirs under the node's ``/dev/shm`` directory) and a
container sees its mounts through environment variables, never at ``mountPath``:

- ``LIFELINE_MOUNT_<VOLUME>``: real path of the mount (volume name upper-cased, every
  character outside ``A-Z0-9`` replaced by ``_``; ``subPath`` appended when given).
- ``LIFELINE_ROOTFS``: the container's working root; each ``mountPath`` also appears
  under it as a symlink (``$LIFELINE_ROOTFS/etc/config -> <volume dir>``), and the process
  starts in ``$LIFELINE_ROOTFS/<workingDir>``.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from kubernetes.client.exceptions import ApiException

from lifeline.errors import ClusterError

__all__ = ["mount_env_name", "materialise_volumes", "container_env", "expand", "field_ref"]


def mount_env_name(volume: str) -> str:
    """``LIFELINE_MOUNT_<VOLUME>`` for a volume name (e.g. ``shm-arena`` -> ``LIFELINE_MOUNT_SHM_ARENA``)."""
    return "LIFELINE_MOUNT_" + re.sub(r"[^A-Z0-9]", "_", volume.upper())


def field_ref(pod: dict, path: str) -> str:
    """Resolve a downward-API ``fieldPath`` (``metadata.name``, ``status.podIP``, labels[...] ...)."""
    md, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (md.get(m.group(1)) or {}).get(m.group(2), "")
    table = {
        "metadata.name": md.get("name"),
        "metadata.namespace": md.get("namespace"),
        "metadata.uid": md.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
        "status.hostIP": status.get("hostIP"),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []),
    }
    if path in ("metadata.labels", "metadata.annotations"):
        d = md.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(d.items()))
    if path not in table:
        raise ClusterError(f"unsupported downward-API fieldPath {path!r}", key=path)
    return table[path] or ""


def _write_items(target: Path, data: dict[str, bytes], items: list[dict] | None, mode: int | None) -> None:
    target.mkdir(parents=True, exist_ok=True)
    pairs = [(i["key"], i["path"], i.get("mode")) for i in items] if items else \
        [(k, k, None) for k in data]
    for key, rel, item_mode in pairs:
        if key not in data:
            raise ClusterError(f"key {key!r} not found", key=key)
        p = target / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data[key])
        p.chmod(item_mode if item_mode is not None else (mode if mode is not None else 0o644))


def _cm_data(cm: dict) -> dict[str, bytes]:
    out = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
    return out


def _secret_data(s: dict) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}


def materialise_volumes(pod: dict, pod_dir: Path, shm_dir: Path, *, get_configmap: Callable[[str], dict | None],
                        get_secret: Callable[[str], dict | None], sa_token: Callable[[dict], str],
                        ca_pem: bytes) -> dict[str, Path]:
    """Create every volume of ``pod`` and return ``{volume name: directory}``.

    Supported: emptyDir (``medium: Memory`` under ``shm_dir``), configMap, secret,
    downwardAPI, projected (serviceAccountToken, configMap, secret, downwardAPI) and hostPath
    (used in place). Contents are written once, at pod start (no live updates).

    Raises:
        ClusterError: an unsupported volume type, or a missing non-optional configMap/secret/key.
    """
    out: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        target = pod_dir / "volumes" / name
        if "emptyDir" in vol:
            if (vol["emptyDir"] or {}).get("medium") == "Memory":
                target = shm_dir / name
            target.mkdir(parents=True, exist_ok=True)
        elif "hostPath" in vol:
            target = Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type") in ("DirectoryOrCreate",):
                target.mkdir(parents=True, exist_ok=True)
        elif "configMap" in vol:
            src = vol["configMap"]
            cm = get_configmap(src["name"])
            if cm is None and not src.get("optional"):
                raise ClusterError(f"configMap {src['name']!r} of volume {name!r} not found", key=name)
            _write_items(target, _cm_data(cm or {}), src.get("items"), src.get("defaultMode"))
        elif "secret" in vol:
            src = vol["secret"]
            s = get_secret(src["secretName"])
            if s is None and not src.get("optional"):
                raise ClusterError(f"secret {src['secretName']!r} of volume {name!r} not found", key=name)
            _write_items(target, _secret_data(s or {}), src.get("items"), src.get("defaultMode"))
        elif "downwardAPI" in vol:
            _downward(target, pod, vol["downwardAPI"].get("items") or [])
        elif "projected" in vol:
            target.mkdir(parents=True, exist_ok=True)
            for src in vol["projected"].get("sources") or []:
                if "serviceAccountToken" in src:
                    t = src["serviceAccountToken"]
                    p = target / t["path"]
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_text(sa_token(t))
                elif "configMap" in src:
                    c = src["configMap"]
                    if c["name"] == "kube-root-ca.crt" and get_configmap(c["name"]) is None:
                        _write_items(target, {"ca.crt": ca_pem}, c.get("items"), None)
                        continue
                    cm = get_configmap(c["name"])
                    if cm is None and not c.get("optional"):
                        raise ClusterError(f"configMap {c['name']!r} of volume {name!r} not found", key=name)
                    _write_items(target, _cm_data(cm or {}), c.get("items"), None)
                elif "secret" in src:
                    c = src["secret"]
                    s = get_secret(c["name"])
                    if s is None and not c.get("optional"):
                        raise ClusterError(f"secret {c['name']!r} of volume {name!r} not found", key=name)
                    _write_items(target, _secret_data(s or {}), c.get("items"), None)
                elif "downwardAPI" in src:
                    _downward(target, pod, src["downwardAPI"].get("items") or [])
        else:
            kind = next((k for k in vol if k != "name"), "?")
            raise ClusterError(f"volume {name!r}: type {kind!r} is not supported by dev-cluster nodes "
                               "(supported: emptyDir, configMap, secret, downwardAPI, projected, hostPath)",
                               key=name)
        out[name] = target
    return out


def _downward(target: Path, pod: dict, items: list[dict]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for item in items:
        if "fieldRef" not in item:
            raise ClusterError("downwardAPI volumes support fieldRef items only", key=item.get("path"))
        p = target / item["path"]
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(field_ref(pod, item["fieldRef"]["fieldPath"]))


_VAR = re.compile(r"\$\((\w+)\)|\$\$")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are substituted, ``$$`` escapes, unknown stay."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, value)


def _resource(container: dict, ref: dict, node_alloc: dict[str, str]) -> str:
    res = ref["resource"]
    kind, _, name = res.partition(".")
    v = ((container.get("resources") or {}).get(kind) or {}).get(name)
    return str(v if v is not None else node_alloc.get(name, "0"))


def container_env(pod: dict, container: dict, *, base: dict[str, str], get_configmap: Callable[[str], dict | None],
                  get_secret: Callable[[str], dict | None], mounts: dict[str, Path], rootfs: Path,
                  node_alloc: dict[str, str]) -> dict[str, str]:
    """The environment of ``container``: ``base``, then envFrom, then env (with ``$(VAR)`` expansion),
    then ``LIFELINE_MOUNT_*`` and ``LIFELINE_ROOTFS``.

    Raises:
        ClusterError: a referenced configMap/secret/key is missing and not optional.
    """
    env = dict(base)
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        if "configMapRef" in src:
            ref = src["configMapRef"]
            cm = get_configmap(ref["name"])
            if cm is None and not ref.get("optional"):
                raise ClusterError(f"envFrom configMap {ref['name']!r} not found", key=ref["name"])
            env.update({prefix + k: v for k, v in ((cm or {}).get("data") or {}).items()})
        elif "secretRef" in src:
            ref = src["secretRef"]
            s = get_secret(ref["name"])
            if s is None and not ref.get("optional"):
                raise ClusterError(f"envFrom secret {ref['name']!r} not found", key=ref["name"])
            env.update({prefix + k: v.decode(errors="replace") for k, v in _secret_data(s or {}).items()})
    for e in container.get("env") or []:
        name = e["name"]
        if "valueFrom" not in e:
            env[name] = expand(e.get("value", ""), env)
            continue
        vf = e["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_ref(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[name] = _resource(container, vf["resourceFieldRef"], node_alloc)
        elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
            is_cm = "configMapKeyRef" in vf
            ref = vf["configMapKeyRef" if is_cm else "secretKeyRef"]
            obj = (get_configmap if is_cm else get_secret)(ref["name"])
            data = (_cm_data(obj) if is_cm else _secret_data(obj)) if obj is not None else {}
            if ref["key"] in data:
                env[name] = data[ref["key"]].decode(errors="replace")
            elif not ref.get("optional"):
                what = "configMap" if is_cm else "secret"
                raise ClusterError(f"env {name}: {what} {ref['name']!r} key {ref['key']!r} not found",
                                   key=ref["name"])
        else:
            raise ClusterError(f"env {name}: unsupported valueFrom {sorted(vf)}", key=name)
    for m in container.get("volumeMounts") or []:
        real = mounts[m["name"]]
        if m.get("subPath"):
            real = real / m["subPath"]
            real.mkdir(parents=True, exist_ok=True) if not real.exists() else None
        env[mount_env_name(m["name"])] = str(real)
        link = rootfs / m["mountPath"].lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            if link.is_symlink() or link.is_file():
                link.unlink()
            else:
                shutil.rmtree(link)
        os.symlink(real, link)
    env["LIFELINE_ROOTFS"] = str(rootfs)
    return env


def secret_or_none(fn: Callable[[], Any]) -> Any:
    """Call ``fn`` returning ``None`` on a 404 ApiException (other errors propagate)."""
    try:
        return fn()
    except ApiException as err:
        if err.status == 404:
            return None
        raise
