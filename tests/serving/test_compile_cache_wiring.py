"""The compile-cache pre-warm wiring, over every rendered stack (under mocks)."""

from __future__ import annotations

from tests.support.policy_eval import allowed
from tests.support.stacks import render_doc
from warmstart.decisions import placement
from warmstart.manifests import compile_cache

ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def _deployment(rendered, model):
    (dep,) = [d for d in rendered.kind("Deployment") if d["metadata"]["name"] == model]
    return dep


def _init(dep, name):
    found = [c for c in dep["spec"]["template"]["spec"].get("initContainers", []) if c["name"] == name]
    return found[0] if found else None


def _env(container):
    return {e["name"]: e.get("value") for e in container["env"]}


def _role_policy(rendered, model):
    # The serving role's (a staged model's staging role has its own, `-staging-<model>-s3`).
    (pol,) = [r for r in rendered.of_type(ROLE_POLICY) if r.name.endswith(f"-identity-{model}-s3")]
    return pol.inputs["policy"]


def test_every_cached_model_restores_before_vllm_and_publishes_after(rendered):
    cached = [m for m in rendered.stack_plan.models if m.compile_cache]
    assert cached, "every stack in stacks/ should exercise the compile cache"
    for m in cached:
        dep = _deployment(rendered, m.name)
        inits = [c["name"] for c in dep["spec"]["template"]["spec"]["initContainers"]]
        restore = _init(dep, compile_cache.RESTORE_CONTAINER)
        publish = _init(dep, compile_cache.PUBLISH_CONTAINER)
        # Restore is a plain init container (it finishes before vLLM starts); publish is a
        # native sidecar (it lives beside vLLM).
        assert "restartPolicy" not in restore and publish["restartPolicy"] == "Always"
        assert inits.index(compile_cache.RESTORE_CONTAINER) < inits.index(compile_cache.PUBLISH_CONTAINER)
        for c in (restore, publish):
            assert c["command"][-1] in ("restore", "publish")
            assert c["image"] == m.image  # the image whose versions the key describes
            mounts = {v["name"]: v for v in c["volumeMounts"]}
            assert mounts["compile-cache"]["mountPath"] == placement.COMPILE_CACHE_MOUNT
            assert not mounts["compile-cache"].get("readOnly")
        # The restore sees the same GPUs as vLLM, so the key names the real accelerator.
        vllm = dep["spec"]["template"]["spec"]["containers"][0]
        gpu = placement.GPU_RESOURCE
        assert restore["resources"]["limits"][gpu] == vllm["resources"]["limits"][gpu]
        assert gpu not in publish["resources"].get("requests", {})


def test_key_inputs_match_the_model_and_its_bucket(rendered):
    bucket_names = {r.inputs.get("bucket") for r in rendered.of_type("aws:s3/bucket:Bucket")}
    aws = rendered.stack_plan.aws
    for m in (m for m in rendered.stack_plan.models if m.compile_cache):
        dep = _deployment(rendered, m.name)
        envs = [_env(_init(dep, n)) for n in (compile_cache.RESTORE_CONTAINER, compile_cache.PUBLISH_CONTAINER)]
        assert envs[0] == envs[1], "restore and publish must compute the same key"
        env = envs[0]
        assert env["WARMSTART_MODEL"] == m.name
        assert env["WARMSTART_TP"] == str(m.tensor_parallel_size)
        assert env["WARMSTART_IMAGE"] == m.image
        # The cache bucket this stack creates, never the model bucket (its pods may not write there).
        assert env["WARMSTART_CACHE_BUCKET"] == aws.compile_cache_bucket in bucket_names
        assert env["WARMSTART_CACHE_BUCKET"] != aws.model_bucket
        assert env["WARMSTART_CACHE_PREFIX"] == f"{m.name}/"
        assert env["WARMSTART_CACHE_DIR"] == placement.COMPILE_CACHE_MOUNT
        assert len(env["WARMSTART_COMPILE_FINGERPRINT"]) == 64


def test_model_role_may_use_exactly_the_keys_its_pods_use(rendered):
    for m in (m for m in rendered.stack_plan.models if m.compile_cache):
        env = _env(_init(_deployment(rendered, m.name), compile_cache.RESTORE_CONTAINER))
        policy = _role_policy(rendered, m.name)
        own = f"arn:aws:s3:::{env['WARMSTART_CACHE_BUCKET']}/{env['WARMSTART_CACHE_PREFIX']}abc.tar.gz"
        assert allowed(policy, "s3:GetObject", own) and allowed(policy, "s3:PutObject", own)
        for other in rendered.stack_plan.models:
            if other.name != m.name:
                foreign = f"arn:aws:s3:::{env['WARMSTART_CACHE_BUCKET']}/{other.name}/abc.tar.gz"
                assert not allowed(policy, "s3:PutObject", foreign)


def test_fingerprint_changes_with_compile_relevant_args(stack_doc, tmp_path):
    doc = stack_doc("dev")
    base = render_doc(doc, tmp_path, "a")
    doc["config"]["warmstart:models"][0]["maxModelLen"] = 4096
    changed = render_doc(doc, tmp_path, "b")
    name = doc["config"]["warmstart:models"][0]["name"]

    def fp(r):
        return _env(_init(_deployment(r, name), compile_cache.RESTORE_CONTAINER))["WARMSTART_COMPILE_FINGERPRINT"]
    assert fp(base) != fp(changed)


def test_eager_models_render_no_cache_wiring(stack_doc, tmp_path):
    doc = stack_doc("dev")
    model = doc["config"]["warmstart:models"][0]
    model["eager"] = True
    rendered = render_doc(doc, tmp_path, "eager")
    dep = _deployment(rendered, model["name"])
    spec = dep["spec"]["template"]["spec"]
    assert not any(c["name"].startswith("compile-cache") for c in spec.get("initContainers", []))
    assert "compile-cache" not in {v["name"] for v in spec["volumes"]}
    assert "--enforce-eager" in spec["containers"][0]["args"]
    assert "XDG_CACHE_HOME" not in _env(spec["containers"][0])


def test_the_shipped_script_is_the_package_module(rendered):
    (cm,) = [o for o in rendered.kind("ConfigMap") if o["metadata"]["name"] == compile_cache.CONFIGMAP_NAME]
    import base64
    import io
    import zipfile

    from warmstart.manifests import pod_scripts

    blob = base64.b64decode(cm["binaryData"][compile_cache.SCRIPT_KEY])
    assert blob == pod_scripts.build(compile_cache.SCRIPT_KEY).blob
    assert "def restore(" in zipfile.ZipFile(io.BytesIO(blob)).read("podside/compile_cache/main.py").decode()


def test_every_jit_cache_and_the_startup_plan_live_on_the_nodes_compile_cache(rendered):
    """Every vLLM container of every shipped stack, in both cluster modes: each JIT cache vLLM's
    image fills (FlashInfer, CUDA, DeepGEMM, TVM-FFI, TileLang) and the startup plan sit under the
    compile-cache mount, a hostPath on the node's NVMe, inside what the publisher carries."""
    from warmstart.manifests import serving
    from warmstart.podside.compile_cache import main as podside

    mount = placement.COMPILE_CACHE_MOUNT
    publisher = podside.Settings.from_env({"WARMSTART_CACHE_PREFIX": "m/", "WARMSTART_MODEL": "m",
                                           "WARMSTART_IMAGE": "i"})
    # Where each tool puts its files under the directory its variable names.
    inside = {"FLASHINFER_WORKSPACE_BASE": ".cache/flashinfer/0.7.2.post1/90a/cached_ops/op/op.so"}
    models = {m.name: m for m in rendered.stack_plan.models}
    deployments = [d for d in rendered.kind("Deployment")
                   if any(c["name"] == "vllm" for c in d["spec"]["template"]["spec"]["containers"])]
    assert deployments
    for dep in deployments:
        m = models[dep["metadata"]["name"]]
        assert m.compile_cache, f"{m.name}: a shipped model without the compile-cache volume keeps its JIT caches in HOME"
        spec = dep["spec"]["template"]["spec"]
        (vllm,) = [c for c in spec["containers"] if c["name"] == "vllm"]
        env = _env(vllm)
        mounted = {v["mountPath"]: v["name"] for v in vllm["volumeMounts"]}
        (volume,) = [v for v in spec["volumes"] if v["name"] == mounted[mount]]
        mode = rendered.stack_plan.cluster_mode
        assert volume["hostPath"]["path"].startswith(placement.NVME_MOUNT[mode] + "/")
        for name, _rel in serving.JIT_CACHE_DIRS:
            path = env[name]
            assert placement.under(path, mount), (m.name, name, path)
            rel = path[len(mount) + 1:] + "/" + inside.get(name, "entry")
            assert publisher.published_path(rel), (name, rel)
        assert env["VLLM_ENABLE_STARTUP_PLAN"] == "1"
        # The plan lands in $VLLM_CACHE_ROOT/startup_plan = $XDG_CACHE_HOME/vllm/startup_plan.
        assert "VLLM_CACHE_ROOT" not in env and env["XDG_CACHE_HOME"] == mount
        assert publisher.published_path("vllm/startup_plan/startup_plan_0123456789abcdef.json")
        # TileLang's scratch is on the same filesystem (it os.replace()s into its cache), not published.
        assert placement.under(env["TILELANG_TMP_DIR"], mount)
        assert not publisher.published_path(env["TILELANG_TMP_DIR"][len(mount) + 1:] + "/1_x.so")
        assert int(env["CUDA_CACHE_MAXSIZE"]) < publisher.max_bytes


def test_the_startup_plan_key_follows_gpu_memory_utilization(stack_doc, tmp_path):
    """vLLM's startup plan depends on gpuMemoryUtilization although neither its own fingerprint nor
    the compile fingerprint holds it: the restore gets its own factor for it."""
    doc = stack_doc("dev")
    base = render_doc(doc, tmp_path, "a")
    model = doc["config"]["warmstart:models"][0]
    model["gpuMemoryUtilization"] = 0.8 if model.get("gpuMemoryUtilization") != 0.8 else 0.85
    changed = render_doc(doc, tmp_path, "b")

    def env(r):
        return _env(_init(_deployment(r, model["name"]), compile_cache.RESTORE_CONTAINER))
    assert env(base)["WARMSTART_STARTUP_PLAN_FINGERPRINT"] != env(changed)["WARMSTART_STARTUP_PLAN_FINGERPRINT"]
