"""The cluster does what the operator will rely on: a Deployment of our broker image becomes
Ready; a StatefulSet behind a headless Service gets stable per-pod DNS names and volumes that
keep their data when a pod is deleted; a ClusterIP Service answers from another pod."""

from __future__ import annotations

import json

from e2e.conftest import Kubectl

TIMEOUT = "180s"
RESOLVE = """
import socket, sys, time
deadline = time.monotonic() + 60
for name in sys.argv[1:]:
    while True:
        try:
            print(name, socket.gethostbyname(name))
            break
        except OSError:
            if time.monotonic() > deadline:
                print(name, "-")
                break
            time.sleep(0.5)
"""
BROKER_START = (
    "printf 'node.id=1\\nlisteners=PLAINTEXT://0.0.0.0:9092\\n"
    "advertised.listeners=PLAINTEXT://broker:9092\\nlog.dirs=/tmp/gregor\\n'"
    " > /tmp/server.properties"
    # A new node's dir is formatted once, before its first start (as `kafka-storage format`).
    " && gregor format --config /tmp/server.properties --cluster-id SmokeTestClusterA1b2C3"
    " --ignore-formatted"
    " && exec gregor broker --config /tmp/server.properties"
)


def apply(kubectl: Kubectl, namespace: str, *documents: dict[str, object]) -> None:
    kubectl(
        "apply",
        "-f",
        "-",
        namespace=namespace,
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(documents)}),
    )


def test_a_deployment_of_the_broker_image_becomes_ready(
    kubectl: Kubectl, namespace: str, broker_image: str
) -> None:
    labels = {"app": "broker"}
    apply(
        kubectl,
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "broker"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "broker",
                                "image": broker_image,
                                "imagePullPolicy": "Never",
                                "command": ["sh", "-c", BROKER_START],
                                "readinessProbe": {
                                    "tcpSocket": {"port": 9092},
                                    "periodSeconds": 2,
                                },
                            }
                        ]
                    },
                },
            },
        },
    )
    kubectl("rollout", "status", "deployment/broker", f"--timeout={TIMEOUT}", namespace=namespace)


def test_statefulset_dns_volumes_and_services(
    kubectl: Kubectl, namespace: str, python_image: str
) -> None:
    labels = {"app": "web"}
    serve = (
        "test -f /data/token || head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /data/token; "
        "cd /data && exec python3 -m http.server 8080"
    )
    apply(
        kubectl,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"clusterIP": "None", "selector": labels, "ports": [{"port": 8080}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web-any"},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "web"},
            "spec": {
                "serviceName": "web",
                "replicas": 3,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        # http.server runs as PID 1 and so ignores SIGTERM: don't wait out 30 s.
                        "terminationGracePeriodSeconds": 1,
                        "containers": [
                            {
                                "name": "web",
                                "image": python_image,
                                "imagePullPolicy": "Never",
                                "command": ["sh", "-c", serve],
                                "readinessProbe": {
                                    "tcpSocket": {"port": 8080},
                                    "periodSeconds": 2,
                                },
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            }
                        ],
                    },
                },
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "64Mi"}},
                        },
                    }
                ],
            },
        },
    )
    kubectl("rollout", "status", "statefulset/web", f"--timeout={TIMEOUT}", namespace=namespace)

    claims = json.loads(kubectl("get", "pvc", "-o", "json", namespace=namespace))["items"]
    assert sorted(c["metadata"]["name"] for c in claims) == [
        "data-web-0",
        "data-web-1",
        "data-web-2",
    ]
    assert {c["status"]["phase"] for c in claims} == {"Bound"}

    # Each pod resolves every pod's stable name to that pod's address. A name appears a moment
    # after its pod turns Ready (endpoint slice, then CoreDNS's watch), so each is retried.
    pods = json.loads(kubectl("get", "pods", "-l", "app=web", "-o", "json", namespace=namespace))
    addresses = {
        f"{p['metadata']['name']}.web.{namespace}.svc.cluster.local": p["status"]["podIP"]
        for p in pods["items"]
    }
    assert len(addresses) == 3
    for pod in range(3):
        answers = kubectl(
            "exec", f"web-{pod}", "--", "python3", "-c", RESOLVE, *addresses, namespace=namespace
        )
        resolved = dict(line.split() for line in answers.splitlines())
        assert resolved == addresses, f"web-{pod} resolved {resolved}, expected {addresses}"

    token = kubectl("exec", "web-1", "--", "cat", "/data/token", namespace=namespace)
    assert len(token) == 16
    kubectl("delete", "pod", "web-1", "--wait=true", namespace=namespace)
    kubectl("rollout", "status", "statefulset/web", f"--timeout={TIMEOUT}", namespace=namespace)
    kubectl(
        "wait", "--for=condition=Ready", "pod/web-1", f"--timeout={TIMEOUT}", namespace=namespace
    )
    assert kubectl("exec", "web-1", "--", "cat", "/data/token", namespace=namespace) == token

    fetch = (
        "import urllib.request, sys; "
        "answer = urllib.request.urlopen('http://web-any/token', timeout=10); "
        "sys.stdout.write(answer.read().decode())"
    )
    tokens = {
        kubectl("exec", f"web-{pod}", "--", "cat", "/data/token", namespace=namespace)
        for pod in range(3)
    }
    answered = {
        kubectl("exec", "web-0", "--", "python3", "-c", fetch, namespace=namespace)
        for _ in range(12)
    }
    assert answered <= tokens, "the ClusterIP Service answered with something else"
    assert len(answered) > 1, "twelve requests through the Service all reached one pod"
