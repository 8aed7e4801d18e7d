#!/usr/bin/env python3
"""Offline checks of pdq's Kubernetes manifests (deploy/k8s) and image recipe.

Renders the base, every overlay and deploy/k8s/monitoring with `kubectl
kustomize` (or a standalone `kustomize build`), validates every rendered
object against the Kubernetes OpenAPI schemas that kubernetes-validate
bundles, strictly (an unknown field fails), for the oldest Kubernetes the
manifests claim and the newest bundled, and then checks what matters to pdq:

- every Deployment container has startup, readiness and liveness probes of
  type grpc (grpc.health.v1, default service) on a declared containerPort
  that the process's --listen flag really listens on, or, where the process
  runs TLS (which the kubelet's gRPC probes cannot speak), its plaintext
  --health-listen port;
- TLS: --tls-cert, --tls-key and --tls-ca come together, and every file a
  server reads its certificates or API keys from lies in a volume mounted
  from a Secret; a router with TLS checks API keys and names the workers'
  certificate (--worker-tls-name, since workers register with pod IPs);
  every overlay (not the base) runs all its servers with TLS;
- every port the process listens on (--listen, --http-listen,
  --metrics-listen, --kv-listen) is a declared containerPort and the reverse;
- every --flag in a container's args is a flag its executable defines (read
  from the C++ sources), and every $(VAR) in the args is a declared env var;
- workers advertise their pod IP (downward API status.podIP), listen for KV
  on it, register with every router (a dns:/// name of a headless Service
  over the router pods, on the router's gRPC port; a ClusterIP Service
  would reach one of them), and take --threads from their own whole-core
  CPU limit; the router runs two or more replicas;
- each Deployment has exactly one PodDisruptionBudget whose selector matches
  its pod labels, and no budget matches two Deployments;
- each Service selects pods and targets ports they declare;
- every HPA scales an existing Deployment (which leaves `replicas` to it) on
  Pods metrics whose names a worker exports (found by grepping the C++
  sources for the string, not from a list kept here) and which the
  prometheus-adapter rules in deploy/k8s/monitoring expose under that name;
  the adapter's Helm values point at that rules ConfigMap, and the scrape
  config gives series the namespace/pod labels the rules map;
- pods run non-root with read-only root filesystems, no privilege
  escalation, all capabilities dropped, and every server sets a
  --drain-seconds that its termination grace period covers (with 10 s to
  spare);
- overlays: cpu asks for no GPU and gives workers whole, guaranteed cores;
  gpu gives each worker nvidia.com/gpu on GPU nodes (and not the router);
  monolithic has no prefill anything and runs --role both without a KV port;
- deploy/container/Containerfile's runtime packages are exactly the Debian
  packages that own the libraries the built executables load (`ldd` +
  `dpkg -S`), when a build and dpkg are present (otherwise a note);
- and a self-test: mutations of the rendered objects (an HPA metric that no
  worker exports, a missing probe, a PDB that matches nothing, ...) must
  each be reported, so the checks are shown able to fail.

Exit status: 0 all passed, 1 a problem (each printed on its own line), 77
skipped (no kubectl/kustomize with kustomize v5, or the virtual environment
lacks kubernetes_validate or PyYAML: run scripts/python_env.sh).

Run: build/pyenv/bin/python tests/k8s/validate_manifests.py [--bin-dir build/bin]
"""

import argparse
import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S_DIR = os.path.join(ROOT, "deploy", "k8s")
CONTAINERFILE = os.path.join(ROOT, "deploy", "container", "Containerfile")

# What gets rendered (relative to deploy/k8s).
RENDERINGS = ["base", "overlays/cpu", "overlays/gpu", "overlays/monolithic", "monitoring"]
APP_RENDERINGS = [r for r in RENDERINGS if r != "monitoring"]
# The oldest Kubernetes the manifests claim (deploy/k8s/base/kustomization.yaml:
# native gRPC probes and PDB unhealthyPodEvictionPolicy); the newest bundled
# schemas are added at run time.
MIN_K8S = "1.27"
# The executables the manifests run, and the C++ sources that define their
# flags (FlagParser calls: flags.String("name", ...), flags.Int(...), ...).
FLAG_SOURCES = {
    "pdq-router": ["router/*.cc", "flags/flags.cc"],
    "pdq-prefill": ["worker/*.cc", "quant/model_flags.cc", "flags/flags.cc"],
    "pdq-decode": ["worker/*.cc", "quant/model_flags.cc", "flags/flags.cc"],
}
WORKERS = ("pdq-prefill", "pdq-decode")
# Where the worker processes' metric names are defined: the worker and the
# server library it links (not the router: an HPA on a router metric would
# scale nothing useful).
WORKER_METRIC_SOURCES = ["worker/*.cc", "worker/*.h", "server/*.cc", "server/*.h",
                         "prefill_worker/*.cc", "decode_worker/*.cc", "kvtransfer/**/*.cc"]
ADAPTER_CONFIGMAP = "pdq-prometheus-adapter"
SCRAPE_CONFIGMAP = "pdq-prometheus-scrape"
ADAPTER_VALUES = os.path.join(K8S_DIR, "monitoring", "prometheus-adapter-values.yaml")
# Runtime packages in the Containerfile that no executable links: the model
# fetch (scripts/fetch_model.sh) in the init containers.
NON_LIBRARY_PACKAGES = {"python3", "python3-pip", "ca-certificates"}
# In debian:12-slim already, not listed.
BASE_IMAGE_PACKAGES = {"libc6"}
LISTEN_FLAGS = ("listen", "http-listen", "metrics-listen", "kv-listen", "health-listen")
TLS_FLAGS = ("tls-cert", "tls-key", "tls-ca")


def skip(msg):
    print("SKIPPED: " + msg)
    sys.exit(SKIP)


try:
    import yaml
except ImportError:
    skip(f"{sys.executable} has no PyYAML; run scripts/python_env.sh and use build/pyenv/bin/python")
try:
    import kubernetes_validate
    from kubernetes_validate import utils as kv_utils
except ImportError:
    skip(f"{sys.executable} has no kubernetes_validate; run scripts/python_env.sh "
         "(it installs scripts/requirements-test.txt into build/pyenv) and use build/pyenv/bin/python")


# ---------------------------------------------------------------- rendering

def _major(version):
    m = re.search(r"v?(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_renderer():
    """(argv prefix, description) for a kustomize v5+, or (None, reasons)."""
    reasons = []
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if kubectl:
        try:
            out = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True,
                                 text=True, timeout=60)
            info = json.loads(out.stdout) if out.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
            info = {}
        kust = info.get("kustomizeVersion", "")
        client = info.get("clientVersion", {}).get("gitVersion", "unknown version")
        v = _major(kust)
        if v and v >= (5, 0):
            return [kubectl, "kustomize"], f"{kubectl} {client} (kustomize {kust})"
        reasons.append(f"{kubectl} {client} embeds kustomize {kust or 'of unknown version'}, "
                       "older than the v5 these manifests need (labels, patches)")
    else:
        reasons.append("no kubectl on PATH (Debian 12 packages none new enough: its "
                       "kubernetes-client is 1.20 with kustomize v2)")
    kustomize = os.environ.get("KUSTOMIZE") or shutil.which("kustomize")
    if kustomize:
        try:
            out = subprocess.run([kustomize, "version"], capture_output=True, text=True, timeout=60)
            text = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        m = re.search(r"v(\d+\.\d+(?:\.\d+)?)", text)
        v = _major(m.group(0)) if m else None
        if v and v >= (5, 0):
            return [kustomize, "build"], f"{kustomize} {m.group(0)}"
        reasons.append(f"{kustomize} is kustomize {m.group(0) if m else 'of unknown version'}, need v5+")
    else:
        reasons.append("no standalone kustomize on PATH")
    return None, reasons


def render(renderer, rel):
    path = os.path.join(K8S_DIR, rel)
    out = subprocess.run(renderer + [path], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return None, f"{' '.join(renderer)} {os.path.relpath(path, ROOT)} failed: {out.stderr.strip()}"
    return [d for d in yaml.safe_load_all(out.stdout) if d], None


# ------------------------------------------------------------ the C++ side

def read_sources(patterns):
    files = []
    for p in patterns:
        files += glob.glob(os.path.join(ROOT, p), recursive=True)
    return {os.path.relpath(f, ROOT): open(f, encoding="utf-8", errors="replace").read()
            for f in sorted(set(files))}


def worker_metric_names():
    """Metric name -> 'file:line' of its first string literal in the worker sources."""
    names = {}
    for rel, text in read_sources(WORKER_METRIC_SOURCES).items():
        for m in re.finditer(r'"(pdq_[a-z0-9_]+)"', text):
            names.setdefault(m.group(1), f"{rel}:{text.count(chr(10), 0, m.start()) + 1}")
    return names


def defined_flags():
    flags = {}
    for exe, patterns in FLAG_SOURCES.items():
        names = {"help"}
        for text in read_sources(patterns).values():
            names |= set(re.findall(r'\.\s*(?:String|Int|Float|Bool)\(\s*"([a-z0-9][a-z0-9-]*)"', text))
        flags[exe] = names
    return flags


# ----------------------------------------------------------------- helpers

def kn(o):
    return f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"


def of_kind(objs, kind):
    return [o for o in objs if o.get("kind") == kind]


def selector_matches(sel, labels):
    """A LabelSelector (matchLabels + matchExpressions) against a label map."""
    if not sel:
        return False
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and labels.get(k) in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return bool(sel.get("matchLabels") or sel.get("matchExpressions"))


def pod_labels(dep):
    return dep["spec"]["template"].get("metadata", {}).get("labels", {}) or {}


def pod_spec(dep):
    return dep["spec"]["template"]["spec"]


def executable(c):
    cmd = (c.get("command") or [None])[0]
    return os.path.basename(cmd) if cmd else None


def parse_args(c):
    """{flag: value or True}, and problems with the form of the args."""
    flags, problems = {}, []
    for a in c.get("args") or []:
        if not a.startswith("--"):
            problems.append(f"arg {a!r} is not --flag=value (write flags with '=' so they can be checked)")
            continue
        name, eq, value = a[2:].partition("=")
        flags[name] = value if eq else True
    return flags, problems


def env_map(c):
    return {e["name"]: e for e in c.get("env") or []}


def var_of(value):
    m = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value or "")
    return m.group(1) if m else None


def split_host_port(value):
    host, _, port = str(value).rpartition(":")
    return host, port


def cpu_cores(q):
    """A CPU quantity in cores (float), or None."""
    if q is None:
        return None
    s = str(q)
    if s.endswith("m"):
        return int(s[:-1]) / 1000
    try:
        return float(s)
    except ValueError:
        return None


def container_ports(c):
    return {p["containerPort"]: p.get("name") for p in c.get("ports") or []}


def deployment_of_pods(objs, sel):
    return [d for d in of_kind(objs, "Deployment") if selector_matches(sel, pod_labels(d))]


# -------------------------------------------------------------- the checks

def check_schemas(objs, versions, where):
    problems = []
    for o in objs:
        for v in versions:
            try:
                kubernetes_validate.validate(o, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = "/".join(str(p) for p in e.absolute_path) or "(top)"
                problems.append(f"{where}: {kn(o)}: not valid for Kubernetes {v} (strict): {e.message} at {path}")
            except (kv_utils.SchemaNotFoundError, kv_utils.VersionNotSupportedError) as e:
                problems.append(f"{where}: {kn(o)}: {e.message}")
    return problems


def check_probe(where, c, kind, probe, listen_port, min_budget_s):
    problems = []
    if not probe:
        return [f"{where}: container {c['name']} has no {kind}"]
    handlers = [h for h in ("grpc", "httpGet", "tcpSocket", "exec") if h in probe]
    if handlers != ["grpc"]:
        return [f"{where}: container {c['name']}: {kind} must be a grpc probe (grpc.health.v1), has {handlers}"]
    port, service = probe["grpc"].get("port"), probe["grpc"].get("service", "")
    if port not in container_ports(c):
        problems.append(f"{where}: container {c['name']}: {kind} grpc port {port} is not a declared containerPort "
                        f"({sorted(container_ports(c))})")
    if listen_port is not None and str(port) != str(listen_port):
        problems.append(f"{where}: container {c['name']}: {kind} probes port {port} but the health service "
                        f"it can reach is on {listen_port}")
    if service:
        problems.append(f"{where}: container {c['name']}: {kind} asks for grpc service {service!r}; pdq's servers "
                        "report health for the default service '' only")
    if min_budget_s:
        budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
        if budget < min_budget_s:
            problems.append(f"{where}: container {c['name']}: {kind} allows {budget} s, want >= {min_budget_s} s "
                            "for the model load")
    return problems


def check_deployments(objs, where, flags_by_exe):
    problems = []
    services = {s["metadata"]["name"]: s for s in of_kind(objs, "Service")}
    for d in of_kind(objs, "Deployment"):
        dn = f"{where}: {kn(d)}"
        spec = pod_spec(d)
        if not selector_matches(d["spec"].get("selector"), pod_labels(d)):
            problems.append(f"{dn}: its selector does not match its own pod labels")
        if spec.get("terminationGracePeriodSeconds", 30) < 30:
            problems.append(f"{dn}: terminationGracePeriodSeconds {spec.get('terminationGracePeriodSeconds')} "
                            "is too short for a drain (want >= 30)")
        grace = spec.get("terminationGracePeriodSeconds", 30)
        for c in spec.get("containers", []):
            flags, _ = parse_args(c)
            drain = flags.get("drain-seconds")
            if drain is None or not str(drain).isdigit():
                problems.append(f"{dn}: container {c['name']} sets no --drain-seconds: SIGTERM "
                                "would end its requests instead of letting them finish")
            elif int(drain) + 10 > grace:
                problems.append(f"{dn}: --drain-seconds={drain} leaves less than 10 s of the "
                                f"{grace} s grace period to stop")
        pod_sc = spec.get("securityContext") or {}
        for c in (spec.get("initContainers") or []) + spec.get("containers", []):
            sc = c.get("securityContext") or {}
            if not (sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))):
                problems.append(f"{dn}: container {c['name']} may run as root (runAsNonRoot not true)")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{dn}: container {c['name']} has a writable root filesystem")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{dn}: container {c['name']} allows privilege escalation")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                problems.append(f"{dn}: container {c['name']} does not drop all capabilities")
            res = c.get("resources") or {}
            if not res.get("requests") or not res.get("limits"):
                problems.append(f"{dn}: container {c['name']} lacks resource requests or limits")
        for c in spec.get("containers", []):
            exe = executable(c)
            if exe not in flags_by_exe:
                problems.append(f"{dn}: container {c['name']} runs {exe!r}, not one of {sorted(flags_by_exe)}")
                continue
            args, form = parse_args(c)
            problems += [f"{dn}: container {c['name']}: {p}" for p in form]
            for name in args:
                if name not in flags_by_exe[exe]:
                    problems.append(f"{dn}: container {c['name']}: {exe} has no flag --{name} "
                                    f"(not defined in {', '.join(FLAG_SOURCES[exe])})")
            env = env_map(c)
            for a in c.get("args") or []:
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                    if var not in env:
                        problems.append(f"{dn}: container {c['name']}: arg {a!r} uses $({var}), which is "
                                        "not in its env (Kubernetes would pass it literally)")
            ports = container_ports(c)
            listened = {}
            for f in LISTEN_FLAGS:
                if f in args:
                    port = split_host_port(args[f])[1]
                    if not port.isdigit():
                        problems.append(f"{dn}: container {c['name']}: --{f}={args[f]} needs a fixed port")
                        continue
                    listened[int(port)] = f
                    if int(port) not in ports:
                        problems.append(f"{dn}: container {c['name']}: --{f} port {port} is not a declared "
                                        "containerPort")
            for p, pname in ports.items():
                if p not in listened:
                    problems.append(f"{dn}: container {c['name']}: containerPort {p} ({pname}) is not a "
                                    "port the process listens on")
            listen_port = split_host_port(args["listen"])[1] if "listen" in args else None
            if listen_port is None:
                problems.append(f"{dn}: container {c['name']}: no --listen (the default port is random)")
            problems += check_tls(dn, c, args, spec)
            if "tls-cert" in args:
                # The kubelet's gRPC probes speak no TLS: they need the
                # plaintext health-only port.
                if "health-listen" not in args:
                    problems.append(f"{dn}: container {c['name']}: runs TLS without --health-listen: the "
                                    "kubelet's gRPC probes cannot speak TLS")
                    listen_port = None
                else:
                    listen_port = split_host_port(args["health-listen"])[1]
            worker = exe in WORKERS
            problems += check_probe(dn, c, "startupProbe", c.get("startupProbe"), listen_port,
                                    300 if worker else 60)
            problems += check_probe(dn, c, "readinessProbe", c.get("readinessProbe"), listen_port, 0)
            problems += check_probe(dn, c, "livenessProbe", c.get("livenessProbe"), listen_port, 0)
            ann = d["spec"]["template"].get("metadata", {}).get("annotations") or {}
            if ann.get("prometheus.io/scrape") != "true":
                problems.append(f"{dn}: pods lack the prometheus.io/scrape annotation")
            metrics_port = [p for p, n in ports.items() if n == "metrics"]
            if not metrics_port or ann.get("prometheus.io/port") != str(metrics_port[0]):
                problems.append(f"{dn}: prometheus.io/port {ann.get('prometheus.io/port')!r} is not the "
                                f"containerPort named metrics ({metrics_port})")
            if metrics_port and listened.get(metrics_port[0]) != "metrics-listen":
                problems.append(f"{dn}: the port named metrics is not where --metrics-listen serves")
            if worker:
                problems += check_worker(dn, c, args, env, services, objs)
    return problems


def check_tls(dn, c, args, spec):
    problems = []
    given = [f for f in TLS_FLAGS if f in args]
    if given and len(given) != len(TLS_FLAGS):
        problems.append(f"{dn}: container {c['name']}: --{', --'.join(given)} without the rest of "
                        f"--{', --'.join(TLS_FLAGS)}")
    secret_volumes = {v["name"] for v in spec.get("volumes") or [] if "secret" in v}
    secret_mounts = [m["mountPath"].rstrip("/") + "/" for m in c.get("volumeMounts") or []
                     if m.get("name") in secret_volumes]
    for f in given + (["api-key-file"] if "api-key-file" in args else []):
        path = str(args[f])
        if not any(path.startswith(m) for m in secret_mounts):
            problems.append(f"{dn}: container {c['name']}: --{f}={path} is not in a volume mounted from a "
                            f"Secret ({secret_mounts or 'none mounted'})")
    if given and executable(c) == "pdq-router":
        if "api-key-file" not in args:
            problems.append(f"{dn}: container {c['name']}: a router with TLS and no --api-key-file lets "
                            "anyone who reaches it generate")
        if not args.get("worker-tls-name"):
            problems.append(f"{dn}: container {c['name']}: no --worker-tls-name: workers register with their "
                            "pod IP, which their certificate does not name")
    return problems


def check_worker(dn, c, args, env, services, objs):
    problems = []
    name = c["name"]

    def from_pod_ip(var):
        e = env.get(var) or {}
        return ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "status.podIP"

    adv = var_of(args.get("advertise-host"))
    if not adv or not from_pod_ip(adv):
        problems.append(f"{dn}: container {name}: --advertise-host must be $(VAR) with VAR from the downward "
                        f"API status.podIP (is {args.get('advertise-host')!r})")
    if args.get("role") != "both":
        host = split_host_port(args.get("kv-listen", ""))[0]
        if not var_of(host) or not from_pod_ip(var_of(host)):
            problems.append(f"{dn}: container {name}: --kv-listen must be on the pod IP ($(VAR) from "
                            "status.podIP): the transport announces the address it listens on")
    router = args.get("router")
    if not router:
        problems.append(f"{dn}: container {name}: no --router to register with")
    else:
        problems += check_router_list(f"{dn}: container {name}", router, services, objs)
    # --threads from this container's whole-core CPU limit.
    limit = cpu_cores(((c.get("resources") or {}).get("limits") or {}).get("cpu"))
    threads = args.get("threads")
    if limit is None:
        problems.append(f"{dn}: container {name}: no CPU limit (--threads must match one)")
    elif limit != int(limit):
        problems.append(f"{dn}: container {name}: CPU limit {limit} is not whole cores")
    var = var_of(threads)
    if var:
        rf = ((env.get(var) or {}).get("valueFrom") or {}).get("resourceFieldRef") or {}
        if rf.get("resource") != "limits.cpu" or rf.get("containerName", name) != name or \
                str(rf.get("divisor", "1")) != "1":
            problems.append(f"{dn}: container {name}: --threads=$({var}) must come from this container's "
                            "limits.cpu with divisor 1")
    elif threads is None or not str(threads).isdigit() or (limit is not None and int(threads) != limit):
        problems.append(f"{dn}: container {name}: --threads={threads} does not match the CPU limit {limit}")
    return problems


def router_deployments(objs):
    return [d for d in of_kind(objs, "Deployment")
            if any(executable(x) == "pdq-router" for x in pod_spec(d)["containers"])]


def check_router_list(where, router, services, objs):
    """A worker's --router list: each entry leads to the routers' gRPC port
    through a Service, a dns:/// entry through a headless one (each pod's
    address), and with several router replicas some entry reaches them all
    (each router keeps its own registry)."""
    problems = []
    reaches_all = False
    router_deps = router_deployments(objs)
    for entry in [e.strip() for e in router.split(",") if e.strip()]:
        dns = entry.startswith("dns:///")
        host, port = split_host_port(entry[len("dns:///"):] if dns else entry)
        svc = services.get(host)
        if svc is None:
            problems.append(f"{where}: --router={router}: no Service named {host!r}")
            continue
        headless = svc["spec"].get("clusterIP") == "None"
        if dns and not headless:
            problems.append(f"{where}: --router={router}: dns:///{host} needs a headless Service "
                            f"(clusterIP: None); {host} has one virtual IP, which leads to one router")
        targets = deployment_of_pods(objs, svc["spec"].get("selector") and
                                     {"matchLabels": svc["spec"]["selector"]})
        routers = [d for d in targets if d in router_deps]
        if not routers:
            problems.append(f"{where}: --router={router} does not lead to the router's gRPC port")
            continue
        rc = next(x for x in pod_spec(routers[0])["containers"] if executable(x) == "pdq-router")
        rlisten = split_host_port(parse_args(rc)[0].get("listen", ""))[1]
        if headless:
            # A headless Service's addresses are the pods': the port dialed
            # is the router's own.
            tnum = port
        else:
            sp = [p for p in svc["spec"].get("ports", []) if str(p.get("port")) == port]
            if not sp:
                problems.append(f"{where}: --router={router}: {host} has no port {port}")
                continue
            tp = sp[0].get("targetPort", sp[0]["port"])
            tnum = tp if isinstance(tp, int) else next(
                (p for p, n in container_ports(rc).items() if n == tp), None)
        if str(tnum) != rlisten:
            problems.append(f"{where}: --router={router} reaches router port {tnum}, "
                            f"but the router's gRPC --listen is on {rlisten}")
        reaches_all |= dns and headless
    replicas = max([d["spec"].get("replicas", 1) for d in router_deps] or [1])
    if replicas > 1 and not reaches_all:
        problems.append(f"{where}: --router={router} registers with one of the {replicas} router "
                        "replicas only (each keeps its own registry); name them all: "
                        "dns:///HEADLESS-SERVICE:PORT")
    return problems


def check_router_replicas(objs, where):
    problems = []
    for d in router_deployments(objs):
        if d["spec"].get("replicas", 1) < 2:
            problems.append(f"{where}: {kn(d)}: one router replica is a single point of failure in "
                            "front of the pools; run two or more")
    return problems


def check_pdbs(objs, where):
    problems = []
    deps = of_kind(objs, "Deployment")
    pdbs = of_kind(objs, "PodDisruptionBudget")
    for p in pdbs:
        matched = deployment_of_pods(objs, p["spec"].get("selector"))
        if len(matched) != 1:
            problems.append(f"{where}: {kn(p)}: its selector matches {len(matched)} Deployments "
                            f"({[kn(d) for d in matched]}); want exactly one")
    for d in deps:
        covering = [p for p in pdbs if selector_matches(p["spec"].get("selector"), pod_labels(d))]
        if len(covering) != 1:
            problems.append(f"{where}: {kn(d)}: {len(covering)} PodDisruptionBudgets select its pods; want one")
    return problems


def check_services(objs, where):
    problems = []
    for s in of_kind(objs, "Service"):
        sel = s["spec"].get("selector")
        targets = deployment_of_pods(objs, sel and {"matchLabels": sel})
        if not targets:
            problems.append(f"{where}: {kn(s)}: selects no Deployment's pods")
            continue
        for p in s["spec"].get("ports", []):
            tp = p.get("targetPort", p["port"])
            for d in targets:
                declared = {}
                for c in pod_spec(d)["containers"]:
                    for num, name in container_ports(c).items():
                        declared[num] = name
                if (isinstance(tp, int) and tp not in declared) or \
                        (isinstance(tp, str) and tp not in declared.values()):
                    problems.append(f"{where}: {kn(s)}: port {p.get('name')} targets {tp!r}, which "
                                    f"{kn(d)} does not declare")
    return problems


def adapter_exposed(monitoring_objs):
    """({custom metric name: series name}, problems) from the adapter's rules ConfigMap."""
    cms = [o for o in of_kind(monitoring_objs, "ConfigMap") if o["metadata"]["name"] == ADAPTER_CONFIGMAP]
    if not cms:
        return {}, [f"monitoring: no ConfigMap {ADAPTER_CONFIGMAP} (the prometheus-adapter rules)"]
    try:
        config = yaml.safe_load(cms[0].get("data", {}).get("config.yaml", ""))
    except yaml.YAMLError as e:
        return {}, [f"monitoring: {ADAPTER_CONFIGMAP}: config.yaml is not YAML: {e}"]
    exposed, problems = {}, []
    for i, rule in enumerate((config or {}).get("rules") or []):
        m = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule.get("seriesQuery", ""))
        if not m:
            problems.append(f"monitoring: adapter rule {i}: seriesQuery {rule.get('seriesQuery')!r} does not "
                            "name one series")
            continue
        series = m.group(1)
        name = rule.get("name") or {}
        matches, as_ = name.get("matches") or "^(.*)$", name.get("as") or "$1"
        if not re.search(matches, series):
            problems.append(f"monitoring: adapter rule {i}: name.matches {matches!r} does not match {series}")
            continue
        exposed_name = re.sub(matches, re.sub(r"\$\{?(\d+)\}?", r"\\\1", as_), series)
        if "<<.GroupBy>>" not in rule.get("metricsQuery", "") or "<<.LabelMatchers>>" not in rule.get(
                "metricsQuery", ""):
            problems.append(f"monitoring: adapter rule {i}: metricsQuery must use <<.LabelMatchers>> and "
                            "group by <<.GroupBy>>")
        overrides = (rule.get("resources") or {}).get("overrides") or {}
        got = {k: (v or {}).get("resource") for k, v in overrides.items()}
        if got.get("namespace") != "namespace" or got.get("pod") not in ("pod", "pods"):
            problems.append(f"monitoring: adapter rule {i} ({series}): resources.overrides must map the "
                            f"namespace and pod labels to namespace and pod (has {got})")
        exposed[exposed_name] = series
    return exposed, problems


def check_monitoring(monitoring_objs, metric_names):
    exposed, problems = adapter_exposed(monitoring_objs)
    for name, series in exposed.items():
        if series not in metric_names:
            problems.append(f"monitoring: adapter rule for {series}: no worker exports that metric "
                            f"(not found as a string in {', '.join(WORKER_METRIC_SOURCES)})")
    try:
        values = yaml.safe_load(open(ADAPTER_VALUES))
        existing = ((values or {}).get("rules") or {}).get("existing")
        if existing != ADAPTER_CONFIGMAP:
            problems.append(f"{os.path.relpath(ADAPTER_VALUES, ROOT)}: rules.existing is {existing!r}, "
                            f"want {ADAPTER_CONFIGMAP!r}")
    except (OSError, yaml.YAMLError) as e:
        problems.append(f"{os.path.relpath(ADAPTER_VALUES, ROOT)}: {e}")
    cms = [o for o in of_kind(monitoring_objs, "ConfigMap") if o["metadata"]["name"] == SCRAPE_CONFIGMAP]
    if not cms:
        problems.append(f"monitoring: no ConfigMap {SCRAPE_CONFIGMAP} (the Prometheus scrape job)")
    else:
        text = next(iter(cms[0].get("data", {}).values()), "")
        jobs = (yaml.safe_load(text) or {}).get("scrape_configs") or []
        relabels = [r for j in jobs for r in j.get("relabel_configs") or []]
        for label, meta in (("namespace", "__meta_kubernetes_namespace"), ("pod", "__meta_kubernetes_pod_name")):
            if not any(r.get("target_label") == label and r.get("source_labels") == [meta] for r in relabels):
                problems.append(f"monitoring: {SCRAPE_CONFIGMAP}: no relabeling of {meta} to '{label}', "
                                "which the adapter rules map to the HPA's pods")
    return exposed, problems


def check_hpas(objs, where, metric_names, exposed):
    problems = []
    deps = {d["metadata"]["name"]: d for d in of_kind(objs, "Deployment")}
    hpas = of_kind(objs, "HorizontalPodAutoscaler")
    for h in hpas:
        hn = f"{where}: {kn(h)}"
        ref = h["spec"]["scaleTargetRef"]
        d = deps.get(ref.get("name")) if ref.get("kind") == "Deployment" else None
        if d is None:
            problems.append(f"{hn}: scales {ref.get('kind')}/{ref.get('name')}, which is not rendered here")
        elif "replicas" in d["spec"]:
            problems.append(f"{hn}: {kn(d)} sets spec.replicas, which every `kubectl apply` would reset "
                            "under the HPA")
        if not h["spec"].get("metrics"):
            problems.append(f"{hn}: no metrics")
        for m in h["spec"].get("metrics") or []:
            if m.get("type") != "Pods":
                problems.append(f"{hn}: metric of type {m.get('type')}, want Pods (per-pod worker load)")
                continue
            name = m["pods"]["metric"]["name"]
            if name not in metric_names:
                problems.append(f"{hn}: metric {name} is not exported by the workers (no string \"{name}\" in "
                                f"{', '.join(WORKER_METRIC_SOURCES)})")
            if name not in exposed:
                problems.append(f"{hn}: metric {name} is not exposed by the prometheus-adapter rules "
                                f"(deploy/k8s/monitoring; they expose {sorted(exposed)})")
            if m["pods"]["target"].get("type") != "AverageValue":
                problems.append(f"{hn}: metric {name}: target type must be AverageValue")
    for d in deps.values():
        if any(executable(c) in WORKERS for c in pod_spec(d)["containers"]) and not any(
                h["spec"]["scaleTargetRef"].get("name") == d["metadata"]["name"] for h in hpas):
            problems.append(f"{where}: {kn(d)}: a worker Deployment without a HorizontalPodAutoscaler")
    return problems


def worker_containers(objs):
    return [(d, c) for d in of_kind(objs, "Deployment") for c in pod_spec(d)["containers"]
            if executable(c) in WORKERS]


def check_overlay(rel, objs):
    problems = []
    where = rel
    if rel.startswith("overlays/"):
        for d in of_kind(objs, "Deployment"):
            for c in pod_spec(d)["containers"]:
                if "tls-cert" not in parse_args(c)[0]:
                    problems.append(f"{where}: {kn(d)}: container {c['name']} runs without TLS (the overlays "
                                    "include components/mtls)")
    if rel == "overlays/monolithic":
        for o in objs:
            comp = o.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")
            if "prefill" in o["metadata"]["name"] or comp == "prefill":
                problems.append(f"{where}: {kn(o)}: the monolithic overlay must have no prefill objects")
        for d in of_kind(objs, "Deployment"):
            for c in pod_spec(d)["containers"]:
                if executable(c) == "pdq-prefill":
                    problems.append(f"{where}: {kn(d)}: runs pdq-prefill")
        wc = worker_containers(objs)
        if not wc:
            problems.append(f"{where}: no worker Deployment")
        for d, c in wc:
            args = parse_args(c)[0]
            if args.get("role") != "both":
                problems.append(f"{where}: {kn(d)}: container {c['name']} runs without --role=both")
            if "kv" in container_ports(c).values():
                problems.append(f"{where}: {kn(d)}: declares a KV port; role both starts no transport")
    gpus = lambda c: ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
    if rel == "overlays/gpu":
        for d, c in worker_containers(objs):
            if not gpus(c) or int(gpus(c)) < 1:
                problems.append(f"{where}: {kn(d)}: container {c['name']} does not request nvidia.com/gpu")
            spec = pod_spec(d)
            if not any(k.startswith("nvidia.com/") for k in (spec.get("nodeSelector") or {})):
                problems.append(f"{where}: {kn(d)}: no nodeSelector for GPU nodes")
            if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations") or []):
                problems.append(f"{where}: {kn(d)}: no toleration of the nvidia.com/gpu taint")
        for d in of_kind(objs, "Deployment"):
            for c in pod_spec(d)["containers"]:
                if executable(c) == "pdq-router" and gpus(c):
                    problems.append(f"{where}: {kn(d)}: the router asks for a GPU")
    if rel == "overlays/cpu":
        for d in of_kind(objs, "Deployment"):
            for c in pod_spec(d).get("containers", []) + (pod_spec(d).get("initContainers") or []):
                if gpus(c):
                    problems.append(f"{where}: {kn(d)}: container {c['name']} asks for a GPU")
        for d, c in worker_containers(objs):
            r = c.get("resources") or {}
            req, lim = (r.get("requests") or {}), (r.get("limits") or {})
            if cpu_cores(req.get("cpu")) != cpu_cores(lim.get("cpu")) or req.get("memory") != lim.get("memory"):
                problems.append(f"{where}: {kn(d)}: container {c['name']} is not Guaranteed QoS "
                                "(requests != limits): no whole cores of its own")
    return problems


def check_app(rel, objs, metric_names, exposed, flags_by_exe):
    return (check_deployments(objs, rel, flags_by_exe) + check_pdbs(objs, rel) +
            check_services(objs, rel) + check_hpas(objs, rel, metric_names, exposed) +
            check_router_replicas(objs, rel) + check_overlay(rel, objs))


# ------------------------------------------------------- the image recipe

def containerfile_runtime_packages():
    text = open(CONTAINERFILE).read().replace("\\\n", " ")
    stages = re.split(r"(?im)^FROM\s", text)
    runtime = stages[-1]
    pkgs = set()
    for m in re.finditer(r"apt-get install ([^&;\n]*)", runtime):
        pkgs |= {w for w in m.group(1).split() if not w.startswith("-")}
    return pkgs


def check_containerfile(bin_dir):
    """(problems, note)."""
    listed = containerfile_runtime_packages()
    if not listed:
        return [f"{os.path.relpath(CONTAINERFILE, ROOT)}: no apt-get install in the runtime stage"], None
    exes = [os.path.join(bin_dir, e) for e in ("pdq", "pdq-router", "pdq-prefill", "pdq-decode")]
    missing = [os.path.relpath(e, ROOT) for e in exes if not os.path.exists(e)]
    if missing:
        return [], f"runtime packages not compared: no {', '.join(missing)} (build first, or pass --bin-dir)"
    if not shutil.which("ldd") or not shutil.which("dpkg"):
        return [], "runtime packages not compared: needs ldd and dpkg (Debian)"
    libs = set()
    for e in exes:
        out = subprocess.run(["ldd", e], capture_output=True, text=True, timeout=60).stdout
        if "libcud" in out:
            return [], f"runtime packages not compared: {e} links CUDA, the image builds with PDQ_CUDA=OFF"
        libs |= set(re.findall(r"=>\s*(/\S+)", out))
    candidates = {}
    for lib in libs:
        for c in (lib, "/usr" + lib if not lib.startswith("/usr/") else lib[4:], os.path.realpath(lib)):
            candidates[c] = lib
    out = subprocess.run(["dpkg", "-S"] + sorted(candidates), capture_output=True, text=True, timeout=120).stdout
    owner = {}
    for line in out.splitlines():
        pkgs, _, path = line.partition(": ")
        if path in candidates:
            owner[candidates[path]] = pkgs.split(",")[0].split(":")[0].strip()
    problems = []
    for lib in sorted(libs - set(owner)):
        problems.append(f"Containerfile: {lib} (loaded by the executables) belongs to no Debian package")
    needed = set(owner.values()) - BASE_IMAGE_PACKAGES
    rel = os.path.relpath(CONTAINERFILE, ROOT)
    for p in sorted(needed - listed):
        libs_of = sorted(os.path.basename(l) for l, o in owner.items() if o == p)
        problems.append(f"{rel}: runtime stage lacks {p} (for {', '.join(libs_of)})")
    for p in sorted(listed - needed - NON_LIBRARY_PACKAGES):
        problems.append(f"{rel}: runtime stage installs {p}, which no executable loads")
    if problems:
        return problems, None
    return [], f"runtime packages match ldd + dpkg -S of {len(exes)} executables ({len(needed)} packages)"


# ------------------------------------------------------------- self-test

def self_test(rendered, metric_names, exposed, flags_by_exe, versions):
    """Each mutation must be reported; returns problems for those that are not."""
    base = rendered["overlays/cpu"]

    def find(objs, kind, name):
        return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)

    def container(objs, dep, name):
        return next(c for c in pod_spec(find(objs, "Deployment", dep))["containers"] if c["name"] == name)

    cases = []

    def case(what, expect, mutate, rel="overlays/cpu", check=None):
        objs = copy.deepcopy(rendered[rel])
        mutate(objs)
        got = (check or (lambda o: check_app(rel, o, metric_names, exposed, flags_by_exe)))(objs)
        cases.append((what, expect, got))

    case("an HPA metric no worker exports", "pdq_no_such_metric is not exported",
         lambda o: find(o, "HorizontalPodAutoscaler", "pdq-prefill")["spec"]["metrics"][0]["pods"]["metric"]
         .__setitem__("name", "pdq_no_such_metric"))
    case("an HPA metric the adapter does not expose", "pdq_reservations is not exposed",
         lambda o: find(o, "HorizontalPodAutoscaler", "pdq-decode")["spec"]["metrics"][0]["pods"]["metric"]
         .__setitem__("name", "pdq_reservations"))
    case("a worker without a readiness probe", "has no readinessProbe",
         lambda o: container(o, "pdq-prefill", "prefill").pop("readinessProbe"))
    case("an HTTP liveness probe", "livenessProbe must be a grpc probe",
         lambda o: container(o, "pdq-decode", "decode").__setitem__(
             "livenessProbe", {"httpGet": {"path": "/healthz", "port": 9090}}))
    case("a grpc probe on an undeclared port", "grpc port 1234 is not a declared containerPort",
         lambda o: container(o, "pdq-router", "router")["readinessProbe"]["grpc"].__setitem__("port", 1234))
    case("a PDB that matches no Deployment", "matches 0 Deployments",
         lambda o: find(o, "PodDisruptionBudget", "pdq-decode")["spec"]["selector"]["matchLabels"]
         .__setitem__("app.kubernetes.io/component", "nothing"))
    case("workers registering through the routers' ClusterIP Service", "registers with one of the 2 router",
         lambda o: container(o, "pdq-decode", "decode")["args"].__setitem__(
             container(o, "pdq-decode", "decode")["args"].index("--router=dns:///pdq-router-peers:50051"),
             "--router=pdq-router:50051"))
    case("a dns:/// router name on a ClusterIP Service", "needs a headless Service",
         lambda o: container(o, "pdq-prefill", "prefill")["args"].__setitem__(
             container(o, "pdq-prefill", "prefill")["args"].index("--router=dns:///pdq-router-peers:50051"),
             "--router=dns:///pdq-router:50051"))
    case("one router replica", "single point of failure",
         lambda o: find(o, "Deployment", "pdq-router")["spec"].__setitem__("replicas", 1))
    case("a flag the worker does not define", "has no flag --no-such-flag",
         lambda o: container(o, "pdq-decode", "decode")["args"].append("--no-such-flag=1"))
    case("--threads not following the CPU limit", "--threads=8 does not match",
         lambda o: container(o, "pdq-prefill", "prefill")["args"].__setitem__(
             container(o, "pdq-prefill", "prefill")["args"].index("--threads=$(PDQ_THREADS)"), "--threads=8"))
    case("a KV listener on 0.0.0.0", "--kv-listen must be on the pod IP",
         lambda o: container(o, "pdq-decode", "decode")["args"].__setitem__(
             [i for i, a in enumerate(container(o, "pdq-decode", "decode")["args"])
              if a.startswith("--kv-listen=")][0], "--kv-listen=0.0.0.0:50053"))
    case("a TLS worker probed on its TLS port", "probes port 50052 but the health service",
         lambda o: container(o, "pdq-decode", "decode")["livenessProbe"]["grpc"].__setitem__("port", 50052))
    case("a certificate outside any Secret volume", "--tls-key=/tmp/pdq-key.pem is not in a volume",
         lambda o: container(o, "pdq-prefill", "prefill")["args"].__setitem__(
             container(o, "pdq-prefill", "prefill")["args"].index("--tls-key=/etc/pdq/tls/pdq-key.pem"),
             "--tls-key=/tmp/pdq-key.pem"))
    case("a TLS router without API keys", "no --api-key-file",
         lambda o: container(o, "pdq-router", "router")["args"].remove(
             "--api-key-file=/etc/pdq/api-keys/api-keys.txt"))
    case("an overlay worker without TLS", "runs without TLS",
         lambda o: container(o, "pdq-decode", "decode").__setitem__(
             "args", [a for a in container(o, "pdq-decode", "decode")["args"] if not a.startswith("--tls-")]))
    case("a drain longer than the grace period", "leaves less than 10 s",
         lambda o: container(o, "pdq-decode", "decode")["args"].__setitem__(
             container(o, "pdq-decode", "decode")["args"].index("--drain-seconds=45"),
             "--drain-seconds=55"))
    case("a worker without a drain", "sets no --drain-seconds",
         lambda o: container(o, "pdq-prefill", "prefill")["args"].remove("--drain-seconds=45"))
    case("a prefill Deployment in the monolithic overlay", "must have no prefill objects",
         lambda o: o.append(copy.deepcopy(find(base, "Deployment", "pdq-prefill"))), rel="overlays/monolithic")
    case("a GPU worker without nvidia.com/gpu", "does not request nvidia.com/gpu",
         lambda o: container(o, "pdq-decode", "decode")["resources"]["limits"].pop("nvidia.com/gpu"),
         rel="overlays/gpu")
    case("a misspelt field (strict schema)", "readinesProbe",
         lambda o: container(o, "pdq-router", "router").__setitem__(
             "readinesProbe", container(o, "pdq-router", "router")["readinessProbe"]),
         check=lambda o: check_schemas(o, versions[:1], "overlays/cpu"))

    def adapter_renamed(objs):
        cm = find(objs, "ConfigMap", ADAPTER_CONFIGMAP)
        cm["data"]["config.yaml"] = cm["data"]["config.yaml"].replace(
            "as: pdq_kv_blocks_used_ratio", "as: pdq_kv_ratio")
        return check_monitoring(objs, metric_names)[0]

    cases.append(("an adapter rule renaming a metric", "pdq_kv_blocks_used_ratio is not exposed",
                  check_hpas(rendered["overlays/cpu"], "overlays/cpu", metric_names,
                             adapter_renamed(copy.deepcopy(rendered["monitoring"])))))
    problems = []
    for what, expect, got in cases:
        if not any(expect in p for p in got):
            problems.append(f"self-test: the checks did not report {what} (expected a problem containing "
                            f"{expect!r}; got {got or 'none'})")
    return problems, len(cases)


# ------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"),
                    help="where the built executables are, for the Containerfile's package check")
    opts = ap.parse_args()

    renderer, why = find_renderer()
    if renderer is None:
        skip("no kustomize v5 to render deploy/k8s with: " + "; ".join(why) +
             ". Install kubectl >= 1.27 (https://kubernetes.io/docs/tasks/tools/) or kustomize v5, "
             "or set KUBECTL / KUSTOMIZE to one")
    latest = kv_utils.latest_version()
    versions = [MIN_K8S] + ([latest] if _major(latest) > _major(MIN_K8S) else [])
    print(f"rendering with {why}; schemas: Kubernetes {' and '.join(versions)} "
          f"(kubernetes-validate {kubernetes_validate.__version__}, strict)")

    problems = []
    rendered = {}
    for rel in RENDERINGS:
        objs, err = render(renderer, rel)
        if err:
            problems.append(err)
            continue
        rendered[rel] = objs
        found = check_schemas(objs, versions, rel)
        problems += found
        if not found:
            print(f"ok: {rel}: {len(objs)} objects valid ({', '.join(sorted({o['kind'] for o in objs}))})")

    metric_names = worker_metric_names()
    flags_by_exe = defined_flags()
    for m in ("pdq_queued_prompt_tokens", "pdq_kv_blocks_used_ratio"):
        if m in metric_names:
            print(f"ok: {m} is defined at {metric_names[m]}")
    exposed = {}
    if "monitoring" in rendered:
        exposed, found = check_monitoring(rendered["monitoring"], metric_names)
        problems += found
        if not found:
            print(f"ok: monitoring: prometheus-adapter exposes {', '.join(sorted(exposed))}")
    for rel in APP_RENDERINGS:
        if rel in rendered:
            found = check_app(rel, rendered[rel], metric_names, exposed, flags_by_exe)
            problems += found
            if not found:
                hpa = [f"{h['metadata']['name']}: " + ", ".join(
                    f"{m['pods']['metric']['name']}={m['pods']['target']['averageValue']}"
                    for m in h["spec"]["metrics"]) for h in of_kind(rendered[rel], "HorizontalPodAutoscaler")]
                print(f"ok: {rel}: probes, ports, flags, PDBs, Services, HPAs ({'; '.join(hpa)})")

    found, note = check_containerfile(opts.bin_dir)
    problems += found
    if note:
        print(("ok: " if not found and note.startswith("runtime packages match") else "note: ") + note)

    # The planted faults are checked against manifests that pass, so that
    # each one is what gets reported.
    if problems or not all(r in rendered for r in RENDERINGS):
        print("note: self-test not run (fix the problems below first)")
    else:
        found, n = self_test(rendered, metric_names, exposed, flags_by_exe, versions)
        problems += found
        if not found:
            print(f"ok: self-test: all {n} planted faults were reported")

    if problems:
        for p in problems:
            print("FAIL: " + p)
        print(f"{len(problems)} problem(s)")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
