"""The security rules every warmstart pod follows (docs/security.md), and which NetworkPolicy
selects a pod: shared by the rendered-stack checks and the node cache's hardening tests."""

from __future__ import annotations

from warmstart.manifests import node_cache, serving


def _selects(policy: dict, namespace: str, labels: dict) -> bool:
    sel = policy["spec"]["podSelector"].get("matchLabels", {})
    return policy["metadata"]["namespace"] == namespace and sel.items() <= labels.items()


def _owner_volume_is_a_host_path(spec: dict, container: dict) -> bool:
    """The chown target is the container's one mount, of a hostPath volume of the pod."""
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return "hostPath" in volume and container["command"][-1] == mount["mountPath"]


def assert_pod_hardened(name: str, spec: dict, labels: dict) -> int:
    """The rules every warmstart pod follows; returns the number of containers checked."""
    # Only the routers (their pod watch), a standby model's actuator (it lists and patches its
    # model's pods), a standby pool's actuator (its hosts' and members' pods, the hosts' replicas)
    # and the node cache's staging pods (their NodeFeature) call the Kubernetes API
    # (docs/security.md, CKV_K8S_38).
    router = labels.get("app.kubernetes.io/name") in ("router", "standby-actuator", "warmstart-standby-pool")
    staging = (labels.get("app.kubernetes.io/name"), labels.get("app.kubernetes.io/component")) == (
        "warmstart-weights", "weights-staging")
    assert spec["automountServiceAccountToken"] is (router or staging), name
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] >= 10000 and pod["runAsGroup"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    checked = 0
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert c["imagePullPolicy"] == "IfNotPresent"
        if c["name"] == serving.CACHE_OWNER_CONTAINER:
            # The root containers: chown only (docs/security.md).
            assert sc["runAsUser"] == 0 and sorted(sc["capabilities"]["add"]) == ["CHOWN", "DAC_READ_SEARCH"]
            assert c["command"][:3] == ["chown", "-R", "-h"]
        elif c["name"] == node_cache.WEIGHTS_OWNER_CONTAINER:
            # Not recursive, so CAP_CHOWN alone; and only the node weights directory.
            assert sc["runAsUser"] == 0 and sc["capabilities"]["add"] == ["CHOWN"]
            assert c["command"][:3] == ["chown", "-h", f"{serving.RUN_AS_UID}:{serving.RUN_AS_GID}"]
            assert _owner_volume_is_a_host_path(spec, c), name
        else:
            assert sc["runAsNonRoot"] is True and "add" not in sc["capabilities"]
            assert sc.get("runAsUser", pod["runAsUser"]) == pod["runAsUser"]
        checked += 1
    return checked
