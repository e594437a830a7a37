// Command crd-schemas turns CustomResourceDefinition manifests into kubeconform-compatible
// standalone-strict JSON schemas: <out>/<kind>-<group prefix>-<version>.json.
//
// scripts/ops/gen-k8s-schemas.sh runs it on the CRDs that controller-gen generates from the
// Prometheus Operator's Go API types (ServiceMonitor, PrometheusRule, ...), so kubeconform can
// validate the chart's monitoring.coreos.com objects offline too.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

type crd struct {
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Kind string `json:"kind"`
		} `json:"names"`
		Versions []struct {
			Name   string `json:"name"`
			Served bool   `json:"served"`
			Schema struct {
				OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

// strict closes every object that lists its properties, drops descriptions, and lets
// properties be null (the API server treats null like an absent field).
func strict(node any, isProperty bool) any {
	switch n := node.(type) {
	case []any:
		for i, v := range n {
			n[i] = strict(v, false)
		}
		return n
	case map[string]any:
		delete(n, "description")
		for k, v := range n {
			switch k {
			case "properties", "patternProperties":
				props := v.(map[string]any)
				for pk, pv := range props {
					props[pk] = strict(pv, true)
				}
			default:
				n[k] = strict(v, false)
			}
		}
		if n["x-kubernetes-int-or-string"] == true {
			delete(n, "type")
			n["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
		}
		if _, ok := n["properties"]; ok {
			if _, set := n["additionalProperties"]; !set && n["x-kubernetes-preserve-unknown-fields"] != true {
				n["additionalProperties"] = false
			}
		}
		if isProperty {
			if t, ok := n["type"].(string); ok {
				n["type"] = []any{t, "null"}
			}
		}
		return n
	default:
		return n
	}
}

func main() {
	in := flag.String("crds", "", "directory of CRD YAML files")
	out := flag.String("out", "", "directory to write schemas into")
	flag.Parse()
	if *in == "" || *out == "" {
		log.Fatal("-crds and -out are required")
	}
	files, err := filepath.Glob(filepath.Join(*in, "*.yaml"))
	if err != nil {
		log.Fatal(err)
	}
	sort.Strings(files)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		log.Fatal(err)
	}
	written := 0
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			log.Fatal(err)
		}
		var c crd
		if err := yaml.Unmarshal(raw, &c); err != nil {
			log.Fatalf("%s: %v", file, err)
		}
		kind := c.Spec.Names.Kind
		for _, v := range c.Spec.Versions {
			if !v.Served || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			schema := strict(v.Schema.OpenAPIV3Schema, false).(map[string]any)
			props, _ := schema["properties"].(map[string]any)
			if props == nil {
				props = map[string]any{}
				schema["properties"] = props
			}
			props["apiVersion"] = map[string]any{"type": []any{"string", "null"}, "enum": []any{c.Spec.Group + "/" + v.Name}}
			props["kind"] = map[string]any{"type": []any{"string", "null"}, "enum": []any{kind}}
			schema["$schema"] = "http://json-schema.org/schema#"
			schema["x-kubernetes-group-version-kind"] = []any{
				map[string]any{"group": c.Spec.Group, "kind": kind, "version": v.Name},
			}
			b, err := json.MarshalIndent(schema, "", "  ")
			if err != nil {
				log.Fatal(err)
			}
			name := fmt.Sprintf("%s-%s-%s.json", strings.ToLower(kind),
				strings.ToLower(strings.Split(c.Spec.Group, ".")[0]), strings.ToLower(v.Name))
			if err := os.WriteFile(filepath.Join(*out, name), append(b, '\n'), 0o644); err != nil {
				log.Fatal(err)
			}
			written++
		}
	}
	fmt.Printf("wrote %d CRD schemas to %s\n", written, *out)
}
