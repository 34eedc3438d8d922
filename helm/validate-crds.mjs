// Validates KEDA and Prometheus Operator custom resources against the JSON schemas generated from
// their CRDs (the @kubernetes-models/keda and @kubernetes-models/prometheus-operator packages).
//
//   node helm/validate-crds.mjs NODE_MODULES_DIR < manifests.json
//
// Reads a JSON array of manifests; prints a JSON array with, for each, null (valid) or the
// problem. Kinds without a known schema are problems too, so nothing passes unchecked.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const MODULES = {
  "keda.sh/v1alpha1": "@kubernetes-models/keda/keda.sh/v1alpha1",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};

const [modulesDir] = process.argv.slice(2);
const manifests = JSON.parse(readFileSync(0, "utf8"));
const results = [];
for (const manifest of manifests) {
  const folder = MODULES[manifest.apiVersion];
  if (!folder) {
    results.push(`no schema for ${manifest.apiVersion}`);
    continue;
  }
  let model;
  try {
    model = await import(pathToFileURL(join(modulesDir, folder, `${manifest.kind}.js`)).href);
  } catch {
    results.push(`no schema for ${manifest.apiVersion} ${manifest.kind}`);
    continue;
  }
  try {
    new model[manifest.kind](manifest).validate();
    results.push(null);
  } catch (error) {
    results.push(String(error.message ?? error));
  }
}
process.stdout.write(JSON.stringify(results));
