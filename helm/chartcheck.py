"""Lints and renders the dcoco chart over every values scenario in helm/scenarios/, and validates
each rendered manifest offline: built-in kinds against the Kubernetes OpenAPI schemas that
kubernetes-validate ships (strict: unknown fields fail), and the KEDA and Prometheus Operator
custom resources against the schemas generated from their CRDs (the @kubernetes-models npm
packages that `make setup` installs under .tools/), through helm/validate-crds.mjs.

    python helm/chartcheck.py [--helm .tools/helm] [--kube-version 1.35.0] [SCENARIO.yaml ...]

Exit status 1 if any lint, render or validation fails; each problem is printed on one line.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

HELM_DIR = Path(__file__).resolve().parent
ROOT = HELM_DIR.parent
CHART = HELM_DIR / "dcoco"
SCENARIOS = HELM_DIR / "scenarios"
TOOLS = ROOT / ".tools"
CRD_VALIDATOR = HELM_DIR / "validate-crds.mjs"
KUBE_VERSION = "1.35.0"
RELEASE = "dcoco"
# Custom resources the chart renders, by apiVersion group; validate-crds.mjs knows their schemas.
CRD_GROUPS = {"keda.sh", "monitoring.coreos.com"}


def helm_binary(helm: Path | None = None) -> Path:
    path = helm or TOOLS / "helm"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `make setup` (it installs helm into .tools/)")
    return path


def helm(args: list[str], helm_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_binary(helm_path)), *args], capture_output=True, text=True, check=False
    )


def render(
    values: list[Path] | None = None,
    sets: list[str] | None = None,
    helm_path: Path | None = None,
    namespace: str = "serving",
) -> list[dict[str, Any]]:
    """`helm template` output as a list of manifests; raises RuntimeError with helm's message."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace]
    args += [f"--values={v}" for v in values or []]
    args += [f"--set={s}" for s in sets or []]
    done = helm(args, helm_path)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or done.stdout.strip())
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def is_custom(manifest: dict[str, Any]) -> bool:
    return str(manifest["apiVersion"]).split("/")[0] in CRD_GROUPS


def validate_builtin(manifest: dict[str, Any], kube_version: str = KUBE_VERSION) -> str | None:
    """None if the manifest is valid against the Kubernetes schema, else the problem."""
    try:
        kubernetes_validate.validate(manifest, kube_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        return f"{path}: {error.message}"
    except kubernetes_validate.SchemaNotFoundError as error:
        return f"no schema: {error.message}"
    return None


def validate_custom(manifests: list[dict[str, Any]]) -> list[str | None]:
    """Validates KEDA and Prometheus Operator resources with their generated schemas (node)."""
    if not manifests:
        return []
    modules = TOOLS / "node_modules"
    if not (modules / "@kubernetes-models").exists():
        raise SystemExit(f"{modules} lacks the CRD schemas: run `make setup`")
    done = subprocess.run(
        ["node", str(CRD_VALIDATOR), str(modules)],
        input=json.dumps(manifests),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"validate-crds.mjs failed: {done.stderr.strip()}")
    results: list[str | None] = json.loads(done.stdout)
    return results


def check_scenario(scenario: Path, helm_path: Path | None, kube_version: str) -> list[str]:
    """Problems found in one scenario: lint, render, then every manifest."""
    name = scenario.name
    problems = []
    lint = helm(["lint", "--strict", str(CHART), f"--values={scenario}"], helm_path)
    if lint.returncode != 0:
        problems.append(f"{name}: helm lint: {lint.stdout.strip()} {lint.stderr.strip()}")
    try:
        manifests = render([scenario], helm_path=helm_path)
    except RuntimeError as error:
        return [*problems, f"{name}: helm template: {error}"]
    builtin = [m for m in manifests if not is_custom(m)]
    custom = [m for m in manifests if is_custom(m)]
    results = [validate_builtin(m, kube_version) for m in builtin] + validate_custom(custom)
    for manifest, problem in zip(builtin + custom, results, strict=True):
        if problem:
            problems.append(f"{name}: {manifest['kind']}/{manifest['metadata']['name']}: {problem}")
    kinds = sorted({m["kind"] for m in manifests})
    print(f"{name}: {len(manifests)} manifests ({len(custom)} custom) valid: {', '.join(kinds)}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path)
    parser.add_argument("--helm", type=Path, default=None)
    parser.add_argument("--kube-version", default=KUBE_VERSION)
    args = parser.parse_args()
    scenarios = args.scenarios or sorted(SCENARIOS.glob("*.yaml"))
    problems = []
    for scenario in scenarios:
        problems += check_scenario(scenario, args.helm, args.kube_version)
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"{len(scenarios)} scenarios, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
