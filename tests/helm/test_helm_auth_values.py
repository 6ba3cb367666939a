"""The chart's auth values render as intended: API keys and the report and dispatch tokens reach the router
through a Secret (generated when none is given, or the operator's own), the network policies let only the
router reach the workers and the report port, and gRPC runs with mutual TLS on chart-made certificates."""

from __future__ import annotations

from pathlib import Path

from chart_render import container_env, containers, find, load_router_config, one, render, router_container


def test_api_keys_reach_the_router_through_the_secret(tmp_path: Path) -> None:
    keys = ["key-0123456789abcdef", "key-fedcba9876543210"]
    objs = render({"auth": {"apiKeys": keys, "reportToken": "fixed-token-for-this-test"}})
    cfg = load_router_config(objs, tmp_path)
    assert list(cfg.security.api_keys) == keys
    assert cfg.security.report_token == "fixed-token-for-this-test"
    assert not any(k in one(objs, "ConfigMap", "router")["data"]["router.yaml"] for k in keys)


def test_without_api_keys_one_is_generated_and_required(tmp_path: Path) -> None:
    # The chart used to leave the API open by default (auth.apiKeys: []).
    objs = render()
    cfg = load_router_config(objs, tmp_path)
    (key,) = cfg.security.api_keys
    assert len(key) >= 40 and len(cfg.security.report_token) >= 32 and len(cfg.security.dispatch_token) >= 32
    api_keys_ref = next(v for v in router_container(objs)["env"] if v["name"] == "ZIPKV_SECURITY__API_KEYS")
    assert "optional" not in api_keys_ref["valueFrom"]["secretKeyRef"]  # a Secret without keys fails the pod
    # Only an explicit auth.openApi leaves it open.
    open_cfg = load_router_config(render({"auth": {"openApi": True}}), tmp_path)
    assert open_cfg.security.api_keys == ()


def test_network_policies_limit_the_worker_and_report_ports_to_the_router() -> None:
    objs = render()
    policies = {p["metadata"]["name"]: p["spec"] for p in find(objs, "NetworkPolicy")}
    fullname = one(objs, "Deployment", "router")["metadata"]["name"].removesuffix("-router")
    router = policies[f"{fullname}-router"]
    report_rule = next(r for r in router["ingress"] if r["ports"][0]["port"] == "grpc-report")
    sources = {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in report_rule["from"]
    }
    assert sources == {"ray-head", "ray-worker"}
    for component in ("ray-head", "ray-worker"):
        spec = policies[f"{fullname}-{component}"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        peers = spec["ingress"][0]["from"]
        pods = {
            p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for p in peers
            if "podSelector" in p
        }
        assert pods == {"router", "ray-head", "ray-worker"}  # no one else reaches Worker.Generate
        assert {"kubernetes.io/metadata.name": "kuberay-system"} in [
            p["namespaceSelector"]["matchLabels"] for p in peers if "namespaceSelector" in p
        ]
    redis = policies[f"{fullname}-redis"]
    assert [
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in redis["ingress"][0]["from"]
    ] == ["router"]
    assert find(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_an_existing_auth_secret_is_used_instead_of_a_new_one() -> None:
    objs = render({"auth": {"existingSecret": "team-zipkv"}})
    assert find(objs, "Secret", "auth") == []
    secret = {"report-token": "t" * 40, "dispatch-token": "d" * 40, "api-keys": '["k-0123456789abcdef"]'}
    env = container_env(router_container(objs), objs, {"team-zipkv": secret})
    assert (
        env["ZIPKV_SECURITY__REPORT_TOKEN"] == "t" * 40 and env["ZIPKV_SECURITY__DISPATCH_TOKEN"] == "d" * 40
    )


def test_grpc_mutual_tls_is_on_with_chart_made_certificates(tmp_path: Path) -> None:
    import base64

    from cryptography import x509
    from cryptography.x509.oid import NameOID

    objs = render()
    secret = next(o for o in find(objs, "Secret") if o["metadata"]["name"].endswith("grpc-tls"))
    pem = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca = x509.load_pem_x509_certificate(pem["ca.crt"])
    for name in ("router", "worker"):
        cert = x509.load_pem_x509_certificate(pem[f"{name}.crt"])
        cert.verify_directly_issued_by(ca)  # raises unless the chart's CA signed it
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"zipkv-{name}"
    cfg = load_router_config(objs, tmp_path)
    assert cfg.security.tls is not None and cfg.security.tls.worker_server_name == "zipkv-worker"
    mounts = {m["name"]: m["mountPath"] for m in router_container(objs)["volumeMounts"]}
    assert cfg.security.tls.cert_file == f"{mounts['grpc-tls']}/router.crt"
    ray = next(containers(one(objs, "RayService")))
    env = container_env(ray, objs)
    assert (
        env["ZIPKV_TLS_CERT"] == f"{mounts['grpc-tls']}/worker.crt"
        and env["ZIPKV_WORKER_IDENTITY"] == "zipkv-worker"
    )
    off = render({"grpcTls": {"enabled": False}})
    assert load_router_config(off, tmp_path).security.tls is None
    assert not [o for o in find(off, "Secret") if o["metadata"]["name"].endswith("grpc-tls")]
    mine = render({"grpcTls": {"existingSecret": "my-certs"}})
    assert not [o for o in find(mine, "Secret") if o["metadata"]["name"].endswith("grpc-tls")]
    volumes = one(mine, "Deployment", "router")["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "grpc-tls")["secret"]["secretName"] == "my-certs"
